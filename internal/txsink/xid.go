package txsink

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// FormatID marks this service's XA transactions ("blg") in XA RECOVER,
// which lists every prepared branch on a server.
const FormatID = 0x626C67

// gtridPrefix starts every global transaction id; the version digit lets a
// later format coexist with branches left by an older binary.
const gtridPrefix = "blg1-"

// GlobalID is a checkpoint's global transaction id (gtrid), parsed:
// "blg1-<instance>-<checkpoint>-<created>", numbers in lower hex. The
// instance is random per process start and the checkpoint number grows per
// attempt, so a gtrid is never reused (XAER_DUPID cannot happen); created,
// in Unix milliseconds, lets any instance judge the age of an undecided
// branch.
type GlobalID struct {
	Instance   string
	Checkpoint uint64
	Created    time.Time
}

// String renders the gtrid.
func (g GlobalID) String() string {
	return gtridPrefix + g.Instance + "-" + strconv.FormatUint(g.Checkpoint, 16) + "-" + strconv.FormatInt(g.Created.UnixMilli(), 16)
}

// ParseGlobalID parses a gtrid of this service; ok is false for anyone
// else's.
func ParseGlobalID(gtrid string) (GlobalID, bool) {
	rest, ok := strings.CutPrefix(gtrid, gtridPrefix)
	if !ok {
		return GlobalID{}, false
	}
	parts := strings.Split(rest, "-")
	if len(parts) != 3 || parts[0] == "" {
		return GlobalID{}, false
	}
	ckpt, err1 := strconv.ParseUint(parts[1], 16, 64)
	ms, err2 := strconv.ParseInt(parts[2], 16, 64)
	if err1 != nil || err2 != nil {
		return GlobalID{}, false
	}
	return GlobalID{Instance: parts[0], Checkpoint: ckpt, Created: time.UnixMilli(ms)}, true
}

// Qualifier is a branch qualifier (bqual), parsed:
// "p<participant>-c<connection>-l<ledger>-m<mac>".
//
//   - participant: the branch's participant (server × slot);
//   - connection: the server's id of the connection that prepared it, in
//     hex. On MariaDB a prepared branch stays attached to that connection
//     (XA COMMIT or ROLLBACK from elsewhere answer XAER_NOTA) until it
//     ends, so a recoverer facing a frozen coordinator needs to know which
//     connection to end;
//   - ledger: the ledger's identity (16 hex digits, random, stored in its
//     control database): XA RECOVER lists every ledger's branches, and only
//     this ledger's decisions are in its control database;
//   - mac: 12 hex digits of HMAC-SHA256 under the ledger's secret over the
//     gtrid and the rest of the bqual. Any account can list prepared
//     branches and start one with any xid; only one that can read the
//     ledger's secret can make a branch recovery takes for its own.
//
// Gtrid and bqual stay under 64 bytes and are plain ASCII, so XA RECOVER
// output parses back.
type Qualifier struct {
	Participant int
	Conn        uint64
	Ledger      string
}

func (q Qualifier) body() string {
	return "p" + strconv.Itoa(q.Participant) + "-c" + strconv.FormatUint(q.Conn, 16) + "-l" + q.Ledger
}

// Identity is a ledger's identity (see Qualifier).
type Identity struct {
	ID     string
	Secret []byte
}

func (id Identity) mac(gtrid, body string) string {
	h := hmac.New(sha256.New, id.Secret)
	h.Write([]byte(gtrid))
	h.Write([]byte{'/'})
	h.Write([]byte(body))
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// Xid names the branch of gtrid with the qualifier q, signed.
func (id Identity) Xid(gtrid string, q Qualifier) driver.Xid {
	body := q.body()
	return driver.Xid{Format: FormatID, Gtrid: gtrid, Bqual: body + "-m" + id.mac(gtrid, body)}
}

// Parse returns the global id and qualifier of x when x is a branch of this
// ledger: this service's format, this ledger's identity and a valid MAC.
func (id Identity) Parse(x driver.Xid) (GlobalID, Qualifier, bool) {
	if x.Format != FormatID {
		return GlobalID{}, Qualifier{}, false
	}
	g, ok := ParseGlobalID(x.Gtrid)
	if !ok {
		return GlobalID{}, Qualifier{}, false
	}
	body, mac, ok := strings.Cut(x.Bqual, "-m")
	if !ok || !hmac.Equal([]byte(mac), []byte(id.mac(x.Gtrid, body))) {
		return GlobalID{}, Qualifier{}, false
	}
	q, ok := parseQualifier(body)
	if !ok || q.Ledger != id.ID {
		return GlobalID{}, Qualifier{}, false
	}
	return g, q, true
}

// parseQualifier parses "p<n>-c<hex>-l<ledger>".
func parseQualifier(s string) (Qualifier, bool) {
	rest, ok := strings.CutPrefix(s, "p")
	if !ok {
		return Qualifier{}, false
	}
	ps, rest, ok1 := strings.Cut(rest, "-c")
	cs, ledger, ok2 := strings.Cut(rest, "-l")
	n, err1 := strconv.Atoi(ps)
	c, err2 := strconv.ParseUint(cs, 16, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || n < 0 || ledger == "" {
		return Qualifier{}, false
	}
	return Qualifier{Participant: n, Conn: c, Ledger: ledger}, true
}
