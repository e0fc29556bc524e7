package txsink

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// FormatID marks this service's XA transactions ("blg") so that XA RECOVER,
// which lists every prepared branch on a server, can be filtered to ours.
const FormatID = 0x626C67

// gtridPrefix starts every global transaction id; the version digit lets a
// later format coexist with branches left by an older binary.
const gtridPrefix = "blg1-"

// Xid names one XA branch: the checkpoint's global transaction id (gtrid)
// and the participant's branch qualifier (bqual).
//
// A gtrid is "blg1-<instance>-<checkpoint>-<created>", the numbers in lower
// hex: instance is random per process start and checkpoint increases per
// attempt, so a gtrid is never reused across retries or restarts (XAER_DUPID
// cannot happen); created, in Unix milliseconds, lets any instance judge the
// age of an undecided branch. bqual is "p<participant>-c<connection id>-s<scope>",
// the connection id in hex: on MariaDB a prepared branch stays attached to
// the connection that prepared it (XA COMMIT or ROLLBACK from elsewhere
// answer XAER_NOTA) until that connection ends, so a recoverer facing a
// frozen coordinator needs to know which connection to end; the scope is
// the deployment's (see scopeOf). Both stay under
// 64 bytes and are plain ASCII, so XA RECOVER output parses back.
type Xid struct {
	Gtrid string
	Bqual string
}

// GlobalID is a parsed gtrid.
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

// bqual is "p<participant>-c<connection id>-s<scope>". The scope names the
// deployment (see scopeOf): XA RECOVER lists every prepared branch on the
// server, also those of another database's ledger, whose decisions live in
// that database; recovery must never decide or resolve those.
func bqual(participant int, conn uint64, scope string) string {
	return "p" + strconv.Itoa(participant) + "-c" + strconv.FormatUint(conn, 16) + "-s" + scope
}

// parseBqual returns the participant, the connection id and the scope of a
// bqual.
func parseBqual(b string) (participant int, conn uint64, scope string, ok bool) {
	rest, scope, found := strings.Cut(b, "-s")
	ps, cs, found2 := strings.Cut(strings.TrimPrefix(rest, "p"), "-c")
	n, err1 := strconv.Atoi(ps)
	c, err2 := strconv.ParseUint(cs, 16, 64)
	return n, c, scope, found && found2 && scope != "" && strings.HasPrefix(b, "p") && err1 == nil && err2 == nil && n >= 0
}

// scopeOf identifies a deployment by the name of its control database,
// hashed to 16 hex digits. The control database holds the decisions, so it
// is exactly the set of branches whose fate this deployment can read: every
// instance of one deployment shares it (whatever host name its DSN spells),
// and two ledgers on one server never do. Group and topic are deliberately
// not part of it: a renamed group must still recover the branches its
// predecessor left.
func scopeOf(controlDB string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(controlDB))
	return fmt.Sprintf("%016x", h.Sum64())
}

// sql renders the xid as XA statements take it: hex literals, so that no
// byte of the ids needs quoting.
func (x Xid) sql() string {
	return fmt.Sprintf("X'%s',X'%s',%d", hex.EncodeToString([]byte(x.Gtrid)), hex.EncodeToString([]byte(x.Bqual)), FormatID)
}
