package event

import "time"

// parseRFC3339 parses an RFC 3339 date-time (section 5.6):
//
//	YYYY-MM-DD ("T" / "t") hh:mm:ss [ "." 1*9DIGIT ] ( "Z" / "z" / ("+" / "-") hh:mm )
//
// and returns it normalised to UTC, or a non-empty description of the
// problem. Stricter than RFC 3339 in three ways, each rejected rather than
// silently altered: at most 9 fractional digits (time.Time resolution), no
// leap second (ss = 60), and the UTC result must lie in years 1000-9999,
// the DATETIME range that MySQL and MariaDB both support (billing windows are
// stored as DATETIME). "-00:00" is accepted as UTC.
// The result is in time.UTC and carries no monotonic reading.
// MinYear and MaxYear bound occurred_at (in UTC): the DATETIME range
// portable between MySQL and MariaDB.
const (
	MinYear = 1000
	MaxYear = 9999
)

func parseRFC3339(s []byte) (time.Time, string) {
	const minLen = len("2006-01-02T15:04:05Z")
	if len(s) < minLen {
		return time.Time{}, "too short"
	}
	if s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':' {
		return time.Time{}, "expected YYYY-MM-DDThh:mm:ss"
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	sec, ok6 := digits(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return time.Time{}, "expected YYYY-MM-DDThh:mm:ss"
	}
	switch {
	case month < 1 || month > 12:
		return time.Time{}, "month out of range"
	case day < 1 || day > daysIn(month, year):
		return time.Time{}, "day out of range"
	case hour > 23:
		return time.Time{}, "hour out of range"
	case minute > 59:
		return time.Time{}, "minute out of range"
	case sec > 59:
		return time.Time{}, "second out of range (leap seconds are not accepted)"
	}
	rest := s[19:]
	nsec := 0
	if len(rest) > 0 && rest[0] == '.' {
		n := 1
		for n < len(rest) && '0' <= rest[n] && rest[n] <= '9' {
			n++
		}
		switch {
		case n == 1:
			return time.Time{}, "no digits after decimal point"
		case n > 10:
			return time.Time{}, "more than 9 fractional second digits"
		}
		frac, _ := digits(rest[1:n])
		for i := n; i < 10; i++ {
			frac *= 10
		}
		nsec = frac
		rest = rest[n:]
	}
	offset := 0 // seconds east of UTC
	switch {
	case len(rest) == 1 && (rest[0] == 'Z' || rest[0] == 'z'):
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, ok1 := digits(rest[1:3])
		om, ok2 := digits(rest[4:6])
		if !ok1 || !ok2 {
			return time.Time{}, "malformed zone offset"
		}
		if oh > 23 || om > 59 {
			return time.Time{}, "zone offset out of range"
		}
		offset = (oh*60 + om) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	case len(rest) == 0:
		return time.Time{}, "missing zone offset"
	default:
		return time.Time{}, "expected fractional seconds or zone offset Z or \u00b1hh:mm"
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if offset != 0 {
		t = t.Add(-time.Duration(offset) * time.Second)
	}
	if y := t.Year(); y < MinYear || y > MaxYear {
		return time.Time{}, "UTC time outside years 1000-9999"
	}
	return t, ""
}

// digits parses an all-ASCII-digit string of at most 9 digits.
func digits(s []byte) (int, bool) {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
