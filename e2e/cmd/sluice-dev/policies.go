package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
)

// inForce is what the banner says about the policies the control plane
// serves: one line per domain, and whether the example is what is in force.
type inForce struct {
	lines       []string
	seedInForce bool // the start-up policies are in force, unchanged
	demo        bool // a policy for the domain envoy/envoy.yaml's filter sends is in force
}

// seedPolicies returns the start-up policies sluice-dev gives the control
// plane, and how to name them: the -policy file, else the embedded example.
func seedPolicies(file string) (*policy.Set, string, error) {
	if file == "" {
		return policy.Example(), "the embedded example (controlplane/policy/example.yaml)", nil
	}
	set, err := policy.Load(file)
	return set, file, err
}

// describePolicies asks the policy service which policies are in force and
// says where each came from: a -policy file owns its domain and is put in
// force at every start; the embedded example seeds only an empty store, so
// after a restart on the same Redis the policies applied before win.
func describePolicies(ctx context.Context, policyAddr, token string, seed *policy.Set, seedName, file string) (inForce, error) {
	conn, err := grpc.NewClient(policyAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return inForce{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	res, err := sluicev1.NewPolicyServiceClient(conn).List(ctx, &sluicev1.ListRequest{})
	if err != nil {
		return inForce{}, fmt.Errorf("listing the policies in force: %w", err)
	}
	return compareWithSeed(res.GetPolicies(), seed, seedName, file), nil
}

// compareWithSeed writes one line per domain in force saying where it came
// from: the -policy file (file, as the control plane was given it), which
// owns it; the start-up policies (identical); or the store (applied
// earlier).
func compareWithSeed(stored []*sluicev1.Policy, seed *policy.Set, seedName, file string) inForce {
	var out inForce
	seedYAML := map[string]string{}
	for _, d := range seed.Domains() {
		if y, err := policy.Marshal(d); err == nil {
			seedYAML[d.Name] = string(y)
		}
	}
	same := 0
	for _, p := range stored {
		out.demo = out.demo || p.GetDomain() == stack.DemoDomain
		y, fromSeed := seedYAML[p.GetDomain()]
		switch {
		case file != "" && p.GetOwner() == file && y == canonical(p):
			same++
			out.lines = append(out.lines, fmt.Sprintf("domain %s (version %d): from %s, in force: the file owns the domain\n"+
				"                   (edit it and the control plane puts it in force; ratectl cannot change it)", p.GetDomain(), p.GetVersion(), seedName))
		case p.GetOwner() != "":
			out.lines = append(out.lines, fmt.Sprintf("domain %s (version %d): from %s, which owns it", p.GetDomain(), p.GetVersion(), p.GetOwner()))
		case fromSeed && y == canonical(p):
			same++
			out.lines = append(out.lines, fmt.Sprintf("domain %s (version %d): from %s", p.GetDomain(), p.GetVersion(), seedName))
		case fromSeed:
			out.lines = append(out.lines, fmt.Sprintf("domain %s (version %d): from the store, applied before this run; it differs from %s,\n"+
				"                   which seeds only an empty store (ratectl apply -f FILE replaces it)", p.GetDomain(), p.GetVersion(), seedName))
		default:
			out.lines = append(out.lines, fmt.Sprintf("domain %s (version %d): from the store, applied before this run", p.GetDomain(), p.GetVersion()))
		}
	}
	if len(stored) == 0 {
		out.lines = []string{"none: the store is empty (its domains were deleted); ratectl apply -f FILE adds one"}
	}
	out.seedInForce = same == len(seedYAML) && same > 0
	return out
}

// canonical returns a stored policy's YAML as policy.Marshal writes it, so
// that it compares with the seed's whatever the spelling it was stored in
// (the store keeps a file's own text); "" if it does not parse.
func canonical(p *sluicev1.Policy) string {
	d, err := policy.Parse(p.GetDomain(), []byte(p.GetYaml()))
	if err != nil {
		return ""
	}
	y, err := policy.Marshal(d)
	if err != nil {
		return ""
	}
	return string(y)
}
