// Package docs holds sluice's documentation (the *.md files beside this one)
// and the tests that keep it true: every metric the control plane and the
// filter export has a row in metrics.md, every YAML and JSON example in
// README.md and docs/ parses with sluice's own parsers or real Envoy, and
// every relative link resolves. The flags, policy fields and plugin fields
// are checked by tests in their own packages (sluice-controlplane, ratectl,
// controlplane/policy) and here (filter/core/config).
package docs

//go:generate go run ./internal/genarch architecture.txt architecture.svg
//go:generate go run ../bench/chart -i bench-rls-lean.txt -o bench-rls-lean.svg
//go:generate go run ../bench/chart -i bench-rls-grpc.txt -o bench-rls-grpc.svg
//go:generate go run ../bench/chart -i bench-rls-h2load.txt -o bench-rls-h2load.svg
