// Package e2e holds sluice's end-to-end tests: real redis-server processes,
// two sluice-controlplane processes built from this tree, two gateways
// running the real filter.wasm in the proxy-wasm host (e2e/host), and an
// upstream that counts what reaches it, all on 127.0.0.1.
//
// The scenarios (issue 6):
//
//  1. a limit of N per window across both gateways admits N in total, then
//     429 with RateLimit-Policy, RateLimit and Retry-After; after Retry-After
//     the key is admitted again (TestLimitAcrossGateways);
//  2. a 10x flood on one key: at least 90% of the rejections never reach a
//     control plane (TestFloodDecidedLocally);
//  3. ratectl apply lowers a limit: both gateways enforce it within 2 s
//     (TestApplyLowersLimit);
//  4. Redis killed under load: no 5xx, decisions continue degraded, back on
//     Redis after restart (TestRedisKilledUnderLoad);
//  5. control planes stopped or hung: each policy's failure mode (open /
//     closed), as the control plane reported it per descriptor, is applied
//     within the filter timeout, and the gateway's own failure mode for
//     descriptors not reported yet (TestControlPlaneDown);
//  6. a bad plugin configuration is refused with the field named, a bad
//     policy applied with ratectl is refused and changes nothing
//     (TestBadPluginConfig, TestBadPolicyRefused).
//
// And from issue 3: three control-plane processes on one Redis, 64 gRPC
// callers, admit exactly each exact algorithm's limit
// (TestAccuracyThreeControlPlanes).
//
// TestMain builds the control plane, ratectl and filter.wasm once.
package e2e
