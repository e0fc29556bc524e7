package txsink

import (
	"encoding/hex"
	"fmt"
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
// age of an undecided branch. bqual is "p<participant index>". Both stay
// under 64 bytes and are plain ASCII, so XA RECOVER output parses back.
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

func bqual(participant int) string { return "p" + strconv.Itoa(participant) }

func parseBqual(b string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(b, "p"))
	return n, err == nil && strings.HasPrefix(b, "p") && n >= 0
}

// sql renders the xid as XA statements take it: hex literals, so that no
// byte of the ids needs quoting.
func (x Xid) sql() string {
	return fmt.Sprintf("X'%s',X'%s',%d", hex.EncodeToString([]byte(x.Gtrid)), hex.EncodeToString([]byte(x.Bqual)), FormatID)
}
