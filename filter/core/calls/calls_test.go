package calls

import (
	"slices"
	"testing"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// handler records the answers it takes.
type handler struct {
	name    string
	answers []string
}

func (h *handler) Answered(a *rlsproto.Answer) { h.answers = append(h.answers, a.Failure) }

// TestTable: a call's answer goes to its handler once; past its deadline a
// call is overdue, once; a call removed or taken is not answered again.
func TestTable(t *testing.T) {
	var tab Table
	d, r, s := &handler{name: "decision"}, &handler{name: "renewal"}, &handler{name: "settlement"}
	tab.Add(1, d, 100)
	tab.Add(2, r, 200)
	tab.Add(3, s, 300)
	if !tab.Has(2) || tab.Len() != 3 {
		t.Fatalf("has 2: %v, len %d", tab.Has(2), tab.Len())
	}
	for _, tt := range []struct {
		id   uint32
		want Handler
		ok   bool
	}{{2, r, true}, {2, nil, false}, {9, nil, false}} {
		if h, ok := tab.Take(tt.id); h != tt.want || ok != tt.ok {
			t.Errorf("Take(%d) = %v %v, want %v %v", tt.id, h, ok, tt.want, tt.ok)
		}
	}
	tab.Remove(3)
	if got := tab.Overdue(nil, 100); len(got) != 0 {
		t.Fatalf("overdue at its deadline: %v", got)
	}
	if got := tab.Overdue(nil, 101); !slices.Equal(got, []Handler{d}) || tab.Len() != 0 {
		t.Fatalf("overdue past its deadline: %v (len %d)", got, tab.Len())
	}
	if got := tab.Overdue(nil, 1000); len(got) != 0 {
		t.Fatalf("overdue twice: %v", got)
	}
}
