package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// Time limits of sharedEnvoy.configure.
const xdsTimeout = 15 * time.Second // until Envoy applies a new version of a ConfigFile

// sharedEnvoy is one of the two Envoy processes the tests share. V8
// compiles filter.wasm once per process, which takes seconds (tens on a
// busy machine); so instead of starting Envoys of its own, each test
// reconfigures these two while they run, as a control plane would over
// xDS: the clusters (control plane, upstream) and the listener (the plugin
// configuration) come from files (stack.ConfigFile). Each configuration
// gets a listener and a plugin name of its own, so a test's requests only
// meet its own filter configuration, whose root contexts (and precheck
// state) are new in every VM; the Wasm VMs themselves are kept.
type sharedEnvoy struct {
	*stack.Envoy
	lds, cds *stack.ConfigFile
}

var (
	sharedOnce sync.Once
	shared     []*sharedEnvoy
	sharedErr  error
	sharedDir  string // set by TestMain
	configured int    // configurations made so far, for their names
)

// nextName returns a name for a new configuration of the shared Envoys:
// in-1, in-2, ...
func nextName() string {
	configured++
	return fmt.Sprintf("in-%d", configured)
}

// sharedEnvoys returns the two shared Envoys, started by the first test
// that asks (and stopped by TestMain).
func sharedEnvoys(t *testing.T) []*sharedEnvoy {
	t.Helper()
	sharedOnce.Do(func() {
		start := time.Now()
		shared, sharedErr = startShared()
		if sharedErr == nil {
			t.Logf("started two Envoys (--concurrency %d, filter.wasm under V8) in %v; RSS %d and %d MiB",
				workers, time.Since(start).Round(time.Millisecond), shared[0].RSS()>>20, shared[1].RSS()>>20)
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// startShared starts both Envoys at once, each with a listener running
// filter.wasm and clusters that lead nowhere.
func startShared() ([]*sharedEnvoy, error) {
	envoys := make([]*sharedEnvoy, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range envoys {
		wg.Go(func() { envoys[i], errs[i] = startSharedEnvoy(fmt.Sprintf("envoy%d", i)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range envoys {
			if e != nil {
				e.Kill()
			}
		}
		return nil, err
	}
	return envoys, nil
}

func startSharedEnvoy(name string) (*sharedEnvoy, error) {
	dir := filepath.Join(sharedDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &sharedEnvoy{}
	var err error
	if s.lds, err = stack.NewListenerFile(dir); err != nil {
		return nil, err
	}
	if s.cds, err = stack.NewClusterFile(dir); err != nil {
		return nil, err
	}
	if err := s.cds.Write(clusters("127.0.0.1:1", "127.0.0.1:1")...); err != nil {
		return nil, err
	}
	// A listener per filter host, so that Envoy loads each (V8 compiles
	// filter.wasm) before the first test.
	var ls []stack.M
	for _, f := range filters {
		ls = append(ls, filterListener(f, "in-0-"+f.Host.Name, plugin().JSON(), "sluice"))
	}
	if err := s.lds.Write(ls...); err != nil {
		return nil, err
	}
	boot := stack.Bootstrap(nil, nil)
	boot["dynamic_resources"] = stack.M{"lds_config": s.lds.ConfigSource(), "cds_config": s.cds.ConfigSource()}
	if s.Envoy, err = stack.StartEnvoy(context.Background(), envoyConfig(dir, name, boot)); err != nil {
		return nil, err
	}
	return s, nil
}

// stopShared stops the shared Envoys, if they were started.
func stopShared() {
	for i, e := range shared {
		if err := e.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: envoy %d: %v\n", i, err)
		}
	}
}

// clusters returns the clusters of an Envoy: the control plane (gRPC) and
// the upstream.
func clusters(cpAddr, upstreamAddr string) []stack.M {
	return []stack.M{
		stack.GRPCCluster(stack.DefaultCluster, cpAddr),
		stack.Cluster("upstream", upstreamAddr),
	}
}

// filterListener returns a listener named name, on a port the kernel
// picks, that runs filter f with the plugin configuration pc (JSON) under
// the plugin name pluginName, then routes to the upstream. Its statistics
// are listener.<name>.* and http.<name>.*.
func filterListener(f stack.Filter, name string, pc []byte, pluginName string) stack.M {
	l := stack.HTTPListener(name, 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "upstream"))},
		f.HTTPFilter(pluginName, pc))
	l["stat_prefix"] = name
	return l
}

// accessLogFormat is what the listeners' access logs say of each request:
// the worker (VM) a test's pinned connection says it is on (header
// x-e2e-vm, "-" for other requests), the api key, the status, and Envoy's
// response code details (the filter's local replies name their reason:
// sluice_precheck_over_limit, sluice_over_limit,
// sluice_rate_limit_service_error; via_upstream for a forwarded request).
const accessLogFormat = "%REQ(X-E2E-VM)% %REQ(X-API-KEY)% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS%\n"

// accessLog returns the access log file of the listener named name.
func (s *sharedEnvoy) accessLog(name string) string {
	return filepath.Join(filepath.Dir(s.LogPath()), name+".access.log")
}

// listener returns the listener configure writes: filterListener, with an
// access log.
func (s *sharedEnvoy) listener(f stack.Filter, name string, pc []byte) stack.M {
	l := filterListener(f, name, pc, "sluice-"+name)
	hcm := l["filter_chains"].([]stack.M)[0]["filters"].([]stack.M)[0]["typed_config"].(stack.M)
	hcm["access_log"] = []stack.M{{
		"name": "envoy.access_loggers.file",
		"typed_config": stack.M{
			"@type":      "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
			"path":       s.accessLog(name),
			"log_format": stack.M{"text_format_source": stack.M{"inline_string": accessLogFormat}},
		},
	}}
	return l
}

// configure points the Envoy at a control plane and an upstream, then
// replaces its listener with a new one (s.listener), named name (see
// nextName), running filter.wasm with the plugin configuration pc under the
// plugin name sluice-<name>, and any extra listeners given. It returns the
// new listener's address once Envoy serves it. A new version Envoy rejects
// is an error.
func (s *sharedEnvoy) configure(f stack.Filter, name string, pc []byte, cpAddr, upstreamAddr string, extra ...stack.M) (addr string, err error) {
	if err := s.apply(s.cds, "cluster_manager.cds", clusters(cpAddr, upstreamAddr)); err != nil {
		return "", err
	}
	l := s.listener(f, name, pc)
	if err := s.apply(s.lds, "listener_manager.lds", append([]stack.M{l}, extra...)); err != nil {
		return "", err
	}
	deadline := time.Now().Add(xdsTimeout)
	for {
		addr, err := s.LookupListener(name)
		if err != nil {
			return "", err
		}
		if addr != "" {
			return addr, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("envoy: listener %s not bound %v after the update", name, xdsTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// apply writes a new version of f and waits until Envoy has accepted it
// (<stats>.update_success grows) or rejected it (<stats>.update_rejected).
func (s *sharedEnvoy) apply(f *stack.ConfigFile, stats string, resources []stack.M) error {
	ok, rejected := s.Stat(stats+".update_success"), s.Stat(stats+".update_rejected")
	if err := f.Write(resources...); err != nil {
		return err
	}
	deadline := time.Now().Add(xdsTimeout)
	for {
		switch {
		case s.Stat(stats+".update_rejected") > rejected:
			return fmt.Errorf("envoy rejected the new version of its %s resources; log:\n%s", stats, logTail(s.LogPath(), 20))
		case s.Stat(stats+".update_success") > ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("envoy did not apply the new version of its %s resources within %v", stats, xdsTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
