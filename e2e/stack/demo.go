package stack

// DemoDomain is the domain of controlplane/policy/example.yaml, which
// `make run` serves.
const DemoDomain = "sluice-demo"
