package policy

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestNewestRatelimitKeys: quota_mode and metadata (envoyproxy/ratelimit's
// newest keys) and charge_past_limit are read onto the descriptor and its
// limits, and survive Marshal.
func TestNewestRatelimitKeys(t *testing.T) {
	d := mustParseFile(t, "ratelimit_quota_metadata.yaml")
	prem := d.Match([]Entry{{"tenant", "team-a-prod"}})
	std := d.Match([]Entry{{"tenant", "team-a-dev"}})
	tok := d.Match([]Entry{{"tokens", "x"}})
	if len(prem) != 1 || len(std) != 1 || len(tok) != 1 {
		t.Fatalf("matches: %v %v %v", prem, std, tok)
	}
	want, err := structpb.NewStruct(map[string]any{"tier": "premium", "limits": map[string]any{"burst": 3, "models": []any{"gpt", "claude"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !prem[0].QuotaMode || !proto.Equal(prem[0].Metadata, want) || prem[0].ChargePastLimit {
		t.Errorf("team-*-prod: quota %v, metadata %v, charge %v", prem[0].QuotaMode, prem[0].Metadata, prem[0].ChargePastLimit)
	}
	if !std[0].QuotaMode || std[0].Metadata.GetFields()["tier"].GetStringValue() != "standard" {
		t.Errorf("tenant: quota %v, metadata %v", std[0].QuotaMode, std[0].Metadata)
	}
	if tok[0].QuotaMode || tok[0].Metadata != nil || !tok[0].ChargePastLimit {
		t.Errorf("tokens: quota %v, metadata %v, charge %v", tok[0].QuotaMode, tok[0].Metadata, tok[0].ChargePastLimit)
	}
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("back.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !back.Equal(d) {
		t.Fatalf("not equal after Marshal:\n%s", out)
	}
	changed := mustParse(t, strings.Replace(string(out), "premium", "gold", 1))
	if changed.Equal(d) {
		t.Fatal("Equal ignores metadata")
	}
}

// TestNewestKeysErrors: metadata that cannot be dynamic metadata, and
// quota_mode or charge_past_limit that are not booleans, are refused with
// the field named.
func TestNewestKeysErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"metadata: [a]", `descriptors[0].metadata: must be a mapping`},
		{"metadata: {at: 2001-12-14T21:59:43Z}", `descriptors[0].metadata: cannot be dynamic metadata`},
		{"quota_mode: sometimes", `descriptors[0].quota_mode: must be true or false`},
		{"charge_past_limit: 2", `descriptors[0].charge_past_limit: must be true or false`},
	} {
		doc := "domain: api\ndescriptors:\n  - key: k\n    " + c.doc + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
		_, err := Parse("v.yaml", []byte(doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.doc, err, c.want)
		}
	}
}
