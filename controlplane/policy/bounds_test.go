package policy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// cyclicDoc is a self-referencing alias: the walk that follows it never ends.
const cyclicDoc = "domain: d\ndescriptors: &d [{key: k, descriptors: *d}]\n"

// deepDoc nests levels descriptors in flow style: 4,990 levels make 143 KB,
// within the YAML library's own depth limit of 10,000.
func deepDoc(levels int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors: ")
	for i := 0; i < levels; i++ {
		fmt.Fprintf(&b, "[{key: k%04d, descriptors: ", i)
	}
	b.WriteString("[]")
	b.WriteString(strings.Repeat("}]", levels))
	b.WriteString("\n")
	return b.String()
}

// laughsDoc is a billion-laughs fan-out without a cycle: ten lists of ten
// descriptors, each list's descriptors nesting the previous list, so the
// last expands to 10^10 descriptors. Every descriptor is distinct, so only
// the size of the expansion can stop it.
func laughsDoc() string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &a%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			if i == 0 {
				fmt.Fprintf(&b, "{key: k0, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}", j)
			} else {
				fmt.Fprintf(&b, "{key: k%d, value: v%d, descriptors: *a%d}", i, j, i-1)
			}
		}
		b.WriteString("]\n")
	}
	return b.String()
}

func TestBoundsErrors(t *testing.T) {
	limit := "rate_limit: {unit: second, requests_per_unit: 1}"
	cases := []struct {
		name, doc string
		want      []string // all in one error
	}{
		{"alias cycle", cyclicDoc, []string{`b.yaml:2: domain "d": descriptors[0].descriptors: alias *d refers to a node that contains it (anchor &d, line 2)`}},
		{"alias cycle through a mapping", "domain: d\ndescriptors:\n  - &m\n    key: k\n    descriptors: [*m]\n",
			[]string{`b.yaml:5: domain "d": descriptors[0].descriptors[0]: alias *m refers to a node that contains it (anchor &m, line 3)`}},
		{"4,990 levels", deepDoc(4990), []string{`b.yaml:2: domain "d": descriptors[0].descriptors[0].(`, `more levels)`, `nested too deeply: more than 128 levels`}},
		{"deep through an alias", "domain: d\nx: &x " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\ndescriptors: [{key: k, descriptors: " + strings.Repeat("[", 30) + "*x" + strings.Repeat("]", 30) + "}]\n",
			[]string{`b.yaml:3: domain "d": descriptors[0].descriptors[0].(25 more levels)[0][0]`, `alias *x expands to more than 128 levels`}},
		{"billion laughs", laughsDoc(), []string{`b.yaml:`, `.descriptors: document too large: alias *a`, `takes it past 1048576 YAML nodes after expanding aliases`}},
		{"long domain", "domain: " + strings.Repeat("d", 200_000) + "\n", []string{`b.yaml:1: domain: too long: 200000 bytes (at most 256): "ddd`}},
		{"long key", "domain: d\ndescriptors: [{key: " + strings.Repeat("k", 257) + ", " + limit + "}]\n", []string{`b.yaml:2: domain "d": descriptors[0].key: too long: 257 bytes (at most 256)`}},
		{"long value", "domain: d\ndescriptors: [{key: k, value: " + strings.Repeat("v", 1025) + ", " + limit + "}]\n", []string{`b.yaml:2: domain "d": descriptors[0].value: too long: 1025 bytes (at most 1024)`}},
		{"long limit name", "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, name: " + strings.Repeat("n", 300) + "}}]\n", []string{`descriptors[0].rate_limit.name: too long: 300 bytes (at most 256)`}},
		{"long field name", "domain: d\n? " + strings.Repeat("f", 5000) + "\n: 1\n", []string{`b.yaml:2: domain "d": ffff`, `...: unknown field (a 5000-byte name)`}},
		{"long wrong scalar", "domain: d\ndescriptors: " + strings.Repeat("x", 5000) + "\n", []string{`descriptors: must be a list, got "xxx`, `..." (5000 bytes)`}},
		{"too large", "domain: d\n#" + strings.Repeat("x", MaxDocumentSize) + "\n", []string{"b.yaml: policy too large: 1048588 bytes (at most 1048576)"}},
		{"not UTF-8", "domain: \"\xff\"\n", []string{"b.yaml: not valid UTF-8 text"}},
		// 100,000 keys in 1 MiB took 30 s in yaml.v3's duplicate-key check.
		{"wide metadata", "domain: d\ndescriptors: [{key: k, " + limit + ", metadata: {l: [{}, " + metadataKeys(100_000) + "]}}]\n",
			[]string{`b.yaml:2: domain "d": descriptors[0].metadata: a mapping of 100000 keys: at most 256 in one mapping of metadata`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := Parse("b.yaml", []byte(c.doc))
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("took %v", d)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if len(msg) > 4096 {
				t.Errorf("error of %d bytes", len(msg))
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%.2000s", w, msg)
				}
			}
		})
	}
}

// metadataKeys writes a flow mapping of n keys.
func metadataKeys(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, "k%d: 1,", i)
	}
	b.WriteString("}")
	return b.String()
}

// TestBoundsAccept checks that the bounds leave real policies alone: 60
// levels of descriptors, names and values at their caps, and aliases that
// expand within the budget.
func TestBoundsAccept(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: " + strings.Repeat("d", MaxNameLen) + "\ndescriptors:\n")
	indent := "  "
	for i := 0; i < 60; i++ {
		fmt.Fprintf(&b, "%s- key: k%d\n%s  descriptors:\n", indent, i, indent)
		indent += "    "
	}
	fmt.Fprintf(&b, "%s- key: %s\n%s  value: %s\n%s  rate_limit: {name: %s, unit: second, requests_per_unit: 1}\n",
		indent, strings.Repeat("k", MaxNameLen), indent, strings.Repeat("v", MaxValueLen), indent, strings.Repeat("n", MaxNameLen))
	b.WriteString("  - key: shared\n    descriptors:\n")
	b.WriteString("      - &l {key: a, value: x, rate_limit: &r {unit: second, requests_per_unit: 1}}\n")
	for i := 0; i < 5; i++ {
		fmt.Fprintf(&b, "      - {key: b%d, rate_limit: *r, descriptors: [*l]}\n", i)
	}
	b.WriteString("  - {key: md, rate_limit: *r, metadata: {wide: " + metadataKeys(MaxMetadataKeys) + "}}\n")
	if _, err := Parse("ok.yaml", []byte(b.String())); err != nil {
		t.Fatal(err)
	}
}

// TestParseNode: a policy built as nodes is parsed as its document would
// be: the same errors, fields and lines (the nodes here are read from the
// document; a program's nodes have no lines).
func TestParseNode(t *testing.T) {
	for _, doc := range []string{
		"domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 3}}]\n",
		"domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 3}}, {key: k}]\n",
	} {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
			t.Fatal(err)
		}
		fromText, errText := Parse("x", []byte(doc))
		fromNode, errNode := ParseNode("x", root.Content[0])
		if errText != nil || errNode != nil {
			if errText == nil || errNode == nil || errText.Error() != errNode.Error() {
				t.Errorf("%q: errors differ:\n%v\n%v", doc, errText, errNode)
			}
			continue
		}
		if fromNode.Name != fromText.Name || len(fromNode.Limits()) != len(fromText.Limits()) || fromNode.Text() != nil {
			t.Errorf("%q: %+v from the nodes, %+v from the text", doc, fromNode, fromText)
		}
	}
}

// TestYAMLLibraryAliasLimits records what go.yaml.in/yaml/v3's own alias
// limits catch: decoding into Go values refuses the cycle and the fan-out,
// but decoding into a yaml.Node (what Parse does, to report lines) keeps
// aliases unexpanded and catches neither: our bounds are the ones that hold.
func TestYAMLLibraryAliasLimits(t *testing.T) {
	for _, doc := range []string{cyclicDoc, laughsDoc()} {
		var v any
		if err := yaml.Unmarshal([]byte(doc), &v); err == nil {
			t.Errorf("the library decoded into a value:\n%.200s", doc)
		}
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
			t.Errorf("the library now refuses it as a node (%v): its limit may make ours redundant", err)
		}
	}
}

// childEnv names the file the child process loads.
const childEnv = "SLUICE_POLICY_BOUNDS_CHILD"

// TestBoundsChild is the child process of TestBoundsPeakMemory: it loads
// one file and prints the error.
func TestBoundsChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("the child process of TestBoundsPeakMemory")
	}
	_, err := Load(path)
	fmt.Printf("LOAD-ERROR %v\n", err)
}

// TestBoundsPeakMemory loads each hostile file at start-up (Load, as -policy
// does) in a child process, and checks its error, its time and its peak
// RSS. The child is killed past 512 MB or 30 s, so the test is bounded even
// when the bounds are not.
func TestBoundsPeakMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bigDomain := filepath.Join(dir, "big.yaml")
	f, err := os.Create(bigDomain)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("domain: ")
	chunk := strings.Repeat("d", 1<<20)
	for i := 0; i < 50; i++ {
		f.WriteString(chunk)
	}
	f.WriteString("\n")
	f.Close()

	deep := deepDoc(4990)
	if len(deep) < 140_000 || len(deep) > 150_000 {
		t.Fatalf("deep file is %d bytes, want about 143 KB", len(deep))
	}
	// Directories of 50 files of 1 MiB, invalid (a flat list) and valid
	// (13,585 limits each): refused before any is read. Then the costliest
	// set that is accepted: 4 MiB of files, 10,000 limits.
	dirOf := func(name string, n int, doc func(i int) string) string {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%02d.yaml", i)), []byte(doc(i)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	flat := "domain: d\ndescriptors: [" + strings.Repeat("1,", MaxDocumentSize/2-20) + "1]\n"
	invalidDir := dirOf("invalid", 50, func(int) string { return flat })
	validDir := dirOf("valid", 50, func(i int) string { return limitsDoc(fmt.Sprintf("d%d", i), 13_585, 0) })
	costliest := dirOf("costliest", 4, func(i int) string {
		return limitsDoc(fmt.Sprintf("d%d", i), MaxLimits/4, MaxDocumentSize-100)
	})
	cases := []struct {
		name, path, want string
		maxMB            int64 // peak RSS
	}{
		{"50 invalid files of 1 MiB", invalidDir, `f04.yaml: policy set too large: this file's 1048563 bytes take the set past 4194304 bytes`, 100},
		{"50 valid files of 1 MiB", validDir, `f04.yaml: policy set too large`, 100},
		{"the costliest set accepted: 4 MiB, 10,000 limits", costliest, `LOAD-ERROR <nil>`, 256},
		{"alias cycle", write("cycle.yaml", cyclicDoc), `cycle.yaml:2: domain "d": descriptors[0].descriptors: alias *d refers to a node that contains it`, 100},
		{"4,990 levels, 143 KB", write("deep.yaml", deep), `deep.yaml:2: domain "d": descriptors[0].descriptors[0]`, 100},
		{"50 MB domain name", bigDomain, `big.yaml: policy too large: more than 1048576 bytes`, 100},
		{"billion laughs", write("laughs.yaml", laughsDoc()), `takes it past 1048576 YAML nodes`, 100},
		// The most nodes 1 MiB can hold (524,000): the YAML library's own
		// tree of them (about 100 MB of heap) is the peak; Parse adds
		// little to it.
		{"1 MiB of one-byte nodes", write("flat.yaml", "domain: d\ndescriptors: ["+strings.Repeat("1,", MaxDocumentSize/2-20)+"1]\n"),
			`flat.yaml:2: domain "d": descriptors[0]: must be a mapping, got the integer 1`, 256},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, rssKB, took := runChild(t, c.path)
			t.Logf("%s: peak RSS %d MB, %v", c.name, rssKB>>10, took.Round(time.Millisecond))
			if !strings.Contains(out, "LOAD-ERROR ") || !strings.Contains(out, c.want) {
				t.Errorf("output lacks %q:\n%.2000s", c.want, out)
			}
			if rssKB > c.maxMB<<10 {
				t.Errorf("peak RSS %d MB, want under %d MB", rssKB>>10, c.maxMB)
			}
			if took > 20*time.Second { // generous: the machine may be busy; unbounded runs are killed at 30 s
				t.Errorf("took %v, want under 20 s", took)
			}
		})
	}
}

// runChild runs TestBoundsChild on path and returns its output, its peak
// RSS in KB and how long it ran. It kills the child past 512 MB or 30 s.
func runChild(t *testing.T, path string) (string, int64, time.Duration) {
	t.Helper()
	var out strings.Builder
	cmd := exec.Command(os.Args[0], "-test.run=^TestBoundsChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			took := time.Since(start)
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			return out.String(), cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss, took
		case <-tick.C:
			if hwm := vmHWM(cmd.Process.Pid); hwm > 512<<10 || time.Since(start) > 30*time.Second {
				cmd.Process.Kill()
				<-done
				t.Fatalf("killed the child after %v at %d MB of RSS", time.Since(start).Round(time.Millisecond), hwm>>10)
			}
		}
	}
}

// vmHWM returns a process's peak RSS in KB from /proc, or 0.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
