// Package policystore keeps the versioned set of rate-limit policies that
// every control-plane replica enforces, and tells each replica when it
// changes.
//
// A Store sits on a Backend: Redis (NewRedis), shared by all replicas, or a
// local file (NewFile) for embedded mode. Apply validates a domain's policy
// with the policy package and writes it in one atomic, optionally
// version-guarded step; every replica then loads the new version, told by
// the backend's change notification or, if that was missed, by polling the
// store's version. Each loaded version becomes an immutable Snapshot that
// replaces the previous one whole, so a decision in flight sees one version
// from start to end. Policy files own the domains they name (Options.Files,
// PutFiles): Apply and Delete refuse those, and the newest version of a
// file wins over the versions other replicas put in force (sources.go):
//
//	files, err := policystore.ReadSources("/etc/sluice/policies")
//	st, err := policystore.New(ctx, backend, policystore.Options{Files: files})
//	...
//	var policies atomic.Pointer[policy.Set]
//	policies.Store(st.Current().Set)
//	go st.Watch(ctx, func(s *policystore.Snapshot) { policies.Store(s.Set) })
package policystore
