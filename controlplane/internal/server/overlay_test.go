package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/policy"
)

func parseSet(t *testing.T, docs ...string) *policy.Set {
	t.Helper()
	var ds []*policy.Domain
	for _, doc := range docs {
		d, err := policy.Parse("overlay.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	set, err := policy.NewSet(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestOverlayOwnsItsDomains: the overlay's domains are served in place of
// the store's of the same name, the store's others stay, and the policy
// store refuses to apply or delete an overlay domain, naming the owner.
func TestOverlayOwnsItsDomains(t *testing.T) {
	const owner = "the xDS server test:1"
	srv := start(t, Config{Policies: policies(t), OverlayOwner: owner,
		ExtraHTTP: []HTTPEndpoint{{Name: "extra", Addr: "127.0.0.1:0", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "extra\n") })}}})
	limitOf := func(domain string) int64 {
		d := srv.RLS().Policies().Domain(domain)
		if d == nil {
			return -1
		}
		return d.Match([]policy.Entry{{Key: "user", Value: "u"}})[0].Requests
	}
	waitUntil(t, "store domain served", 10*time.Second, func() bool { return limitOf("srv") == 2 })

	srv.SetOverlay(parseSet(t,
		"domain: srv\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 9}}]",
		"domain: xds-only\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 4}}]"))
	if limitOf("srv") != 9 || limitOf("xds-only") != 4 {
		t.Fatalf("overlay not in force: srv %d, xds-only %d", limitOf("srv"), limitOf("xds-only"))
	}
	ctx := context.Background()
	_, err := srv.Policies().Apply(ctx, "ratectl", []byte("domain: xds-only\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 1}}]"), policystore.Guard{})
	var owned *policystore.OwnedError
	if !errors.As(err, &owned) || owned.Owner != "overlay.yaml from "+owner {
		t.Fatalf("apply on an overlay domain: %v, want an OwnedError naming %q", err, owner)
	}
	if _, err := srv.Policies().Delete(ctx, "srv", policystore.Guard{}); !errors.Is(err, policystore.ErrOwned) {
		t.Fatalf("delete of an overlay domain: %v", err)
	}
	if _, err := srv.Policies().Apply(ctx, "ratectl", []byte("domain: other\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 5}}]"), policystore.Guard{}); err != nil {
		t.Fatalf("apply on a free domain: %v", err)
	}
	waitUntil(t, "store domain beside the overlay", 10*time.Second, func() bool { return limitOf("other") == 5 && limitOf("srv") == 9 })

	// The overlay shrinks: its old domain goes back to the store's version.
	srv.SetOverlay(parseSet(t, "domain: xds-only\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 4}}]"))
	if limitOf("srv") != 2 || limitOf("xds-only") != 4 || limitOf("other") != 5 {
		t.Fatalf("after the overlay shrank: srv %d, xds-only %d, other %d", limitOf("srv"), limitOf("xds-only"), limitOf("other"))
	}
	if code, body := get(t, "http://"+srv.ExtraHTTPAddr("extra")+"/"); code != 200 || body != "extra\n" {
		t.Fatalf("extra listener: %d %q", code, body)
	}
}
