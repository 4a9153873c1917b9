package llm

import (
	"math/bits"
	"strconv"
	"strings"
)

// Weighted cost: a budget counts input*a + output*b + cached*c (+
// cache_write*d) with weights per model, so that it can be dollars as
// well as tokens.

// WeightScale is the unit of weights: a weight is budget units per
// WeightScale (a million) tokens, as providers quote prices. With a budget
// in micro-dollars, $3 per million tokens is the weight 3000000; with a
// budget in tokens, the weight 1000000 counts each token once.
const WeightScale = 1_000_000

// MaxWeight bounds a weight (10^12 units per million tokens).
const MaxWeight = 1_000_000_000_000

// MaxRows bounds a weight table.
const MaxRows = 1024

// Weights are the weights of one model, in units per WeightScale tokens.
type Weights struct {
	Input, Output, Cached, CacheWrite int64
}

// Cost is u's cost: the weighted sum divided by WeightScale, rounded up
// (so that any usage of a priced model costs at least 1), saturating at
// MaxTokens. The sum is exact: 128-bit products of counts up to MaxTokens
// and weights up to MaxWeight.
func (w Weights) Cost(u Usage) int64 {
	var hi, lo uint64
	for _, t := range [4][2]int64{{u.Input, w.Input}, {u.Output, w.Output}, {u.Cached, w.Cached}, {u.CacheWrite, w.CacheWrite}} {
		if t[0] <= 0 || t[1] <= 0 {
			continue
		}
		ph, pl := bits.Mul64(uint64(t[0]), uint64(t[1]))
		var carry uint64
		lo, carry = bits.Add64(lo, pl, 0)
		hi, _ = bits.Add64(hi, ph, carry)
	}
	if hi >= WeightScale { // the quotient would not fit in 64 bits
		return MaxTokens
	}
	q, rem := bits.Div64(hi, lo, WeightScale)
	if rem != 0 {
		q++
	}
	if q > MaxTokens {
		return MaxTokens
	}
	return int64(q)
}

// Row is one row of a weight table as a configuration gives it.
type Row struct {
	// Model is a model name as requests give it; "name*" matches every
	// model whose name starts with name; "*" alone is the default row,
	// which every table has.
	Model                 string
	Input, Output, Cached int64
	// CacheWrite weighs Anthropic's cache_creation_input_tokens; when
	// HasCacheWrite is false it is Input.
	CacheWrite    int64
	HasCacheWrite bool
}

// Table finds a model's weights: its exact row, else the row of the
// longest prefix that matches it, else the default row. Build one with
// NewTable; it is read-only and safe to share.
type Table struct {
	exact    map[string]Weights
	prefixes []prefixRow // longest prefix first
	def      Weights
}

type prefixRow struct {
	prefix string
	w      Weights
}

// TableError says what is wrong with a weight table, and where: Row is
// the row's index (-1: the table as a whole), Field the row's field.
type TableError struct {
	Row     int
	Field   string // "model", "input", "output", "cached", "cache_write"; "" with Row -1
	Problem string
}

// Path is where the error is, relative to the table: "[2].output", or ""
// for the table as a whole. A configuration parser prefixes its own path.
func (e *TableError) Path() string {
	if e.Row < 0 {
		return ""
	}
	return "[" + strconv.Itoa(e.Row) + "]." + e.Field
}

// Error implements error.
func (e *TableError) Error() string {
	if e.Row < 0 {
		return "weights: " + e.Problem
	}
	return "weights" + e.Path() + ": " + e.Problem
}

// NewTable validates rows and builds their Table; the error is a
// *TableError naming the first problem's row and field.
func NewTable(rows []Row) (*Table, error) {
	if len(rows) > MaxRows {
		return nil, &TableError{Row: -1, Problem: "has " + strconv.Itoa(len(rows)) + " rows, more than " + strconv.Itoa(MaxRows)}
	}
	t := &Table{exact: make(map[string]Weights)}
	seen := make(map[string]int, len(rows))
	hasDefault := false
	for i, r := range rows {
		w, err := r.weights(i)
		if err != nil {
			return nil, err
		}
		if err := checkModel(i, r.Model); err != nil {
			return nil, err
		}
		if j, dup := seen[r.Model]; dup {
			return nil, &TableError{Row: i, Field: "model", Problem: strconv.Quote(r.Model) + " is also row " + strconv.Itoa(j)}
		}
		seen[r.Model] = i
		switch {
		case r.Model == "*":
			t.def, hasDefault = w, true
		case strings.HasSuffix(r.Model, "*"):
			t.prefixes = append(t.prefixes, prefixRow{strings.TrimSuffix(r.Model, "*"), w})
		default:
			t.exact[r.Model] = w
		}
	}
	if !hasDefault {
		return nil, &TableError{Row: -1, Problem: `needs a default row (model "*") for the models no other row names`}
	}
	sortLongestFirst(t.prefixes)
	return t, nil
}

// checkModel validates row i's model name.
func checkModel(i int, m string) error {
	problem, star := "", strings.IndexByte(m, '*')
	switch {
	case m == "":
		problem = "must not be empty"
	case len(m) > MaxModelBytes:
		problem = "is longer than " + strconv.Itoa(MaxModelBytes) + " bytes"
	case star >= 0 && star < len(m)-1:
		problem = `may hold "*" only as its last character: ` + strconv.Quote(m)
	}
	if problem == "" {
		return nil
	}
	return &TableError{Row: i, Field: "model", Problem: problem}
}

// weights validates row i's weights.
func (r *Row) weights(i int) (Weights, error) {
	w := Weights{Input: r.Input, Output: r.Output, Cached: r.Cached, CacheWrite: r.Input}
	if r.HasCacheWrite {
		w.CacheWrite = r.CacheWrite
	}
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"input", r.Input}, {"output", r.Output}, {"cached", r.Cached}, {"cache_write", w.CacheWrite}} {
		if f.v < 0 || f.v > MaxWeight {
			return Weights{}, &TableError{Row: i, Field: f.name,
				Problem: "must be between 0 and " + strconv.FormatInt(MaxWeight, 10) + " (units per million tokens), not " + strconv.FormatInt(f.v, 10)}
		}
	}
	return w, nil
}

// sortLongestFirst orders prefix rows so that the first match is the
// longest (insertion sort: tables are small, and it keeps sort out of
// the filter).
func sortLongestFirst(p []prefixRow) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && len(p[j].prefix) > len(p[j-1].prefix); j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// Weights returns model's weights.
func (t *Table) Weights(model string) Weights {
	if w, ok := t.exact[model]; ok {
		return w
	}
	for i := range t.prefixes {
		if strings.HasPrefix(model, t.prefixes[i].prefix) {
			return t.prefixes[i].w
		}
	}
	return t.def
}

// Cost is u's cost with model's weights.
func (t *Table) Cost(model string, u Usage) int64 {
	return t.Weights(model).Cost(u)
}
