package policy

import (
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// MaxMaxWait bounds reserve's max_wait. The filter holds a waiting request
// in Envoy (memory, a stream, the client's patience), and a route's timeout
// (15 s by default) ends most waits long before an hour; beyond that a wait
// is a misconfiguration, not shaping.
const MaxMaxWait = time.Hour

// maxWait parses max_wait into l.MaxWait: required for reserve, refused for
// the other algorithms; a duration from 0 to MaxMaxWait in whole
// microseconds (the resolution of the Redis clock). It reports whether the
// field is valid.
func (p *parser) maxWait(l *Limit, fs map[string]field, limitLine int, path string, algoOK bool) bool {
	f, has := fs["max_wait"]
	fpath := join(path, "max_wait")
	switch {
	case !algoOK:
		return true // the algorithm's error says it all
	case !has && l.Algorithm == algorithms.KindReserve:
		p.errorf(limitLine, fpath, "required with algorithm reserve: the longest a request may wait (e.g. 500ms; 0s never waits)")
		return false
	case !has:
		return true
	case l.Algorithm != algorithms.KindReserve:
		p.errorf(f.key.Line, fpath, "only reserve takes a max_wait (algorithm is %s)", l.Algorithm)
		return false
	}
	s, ok := p.scalar(f, fpath)
	if !ok {
		return false
	}
	if tag := resolve(f.val).Tag; (tag == "!!int" && s != "0") || tag == "!!float" {
		p.errorf(f.val.Line, fpath, "must be a duration with a unit, e.g. 500ms or 2s (got %s)", s)
		return false
	}
	w, err := time.ParseDuration(s)
	switch {
	case err != nil:
		p.errorf(f.val.Line, fpath, "not a duration: %q (use ns, us, ms, s, m or h, e.g. 500ms, 2s)", s)
	case w < 0:
		p.errorf(f.val.Line, fpath, "must be >= 0 (got %s)", s)
	case w > MaxMaxWait:
		p.errorf(f.val.Line, fpath, "must be at most %s: the filter holds waiting requests in Envoy (got %s)", MaxMaxWait, s)
	case w%time.Microsecond != 0:
		p.errorf(f.val.Line, fpath, "must be a whole number of microseconds, the resolution of the Redis clock (got %s)", s)
	default:
		l.MaxWait = w
		return true
	}
	return false
}
