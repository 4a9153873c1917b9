package stack

import (
	"context"
	"fmt"
	"path/filepath"
)

// BuildNativeModule builds the package pkg of the sluice module (e.g.
// "./filter/native") as an Envoy dynamic module, dir/lib<name>.so, for this
// machine, and returns its path. Envoy finds it by name when dir is its
// working directory or $ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
func BuildNativeModule(ctx context.Context, pkg, dir, name string) (string, error) {
	out := filepath.Join(dir, "lib"+name+".so")
	if err := buildModule(ctx, pkg, out); err != nil {
		return "", err
	}
	return out, nil
}

// BuildNative builds libsluice.so, the filter's native host
// (./filter/native), into the file out, which NativeFilterFile loads.
func BuildNative(ctx context.Context, out string) error {
	return buildModule(ctx, "./filter/native", out)
}

// BuildNativeTest is BuildNative with the sluicetest build tag: the
// module's tests may then make it panic on demand (a request header names
// the hook).
func BuildNativeTest(ctx context.Context, out string) error {
	return buildModule(ctx, "./filter/native", out, "-tags", "sluicetest")
}

// buildModule builds the package pkg as an Envoy dynamic module into out,
// with further go build flags.
func buildModule(ctx context.Context, pkg, out string, flags ...string) error {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return err
	}
	args := append(append([]string{"build", "-buildmode=c-shared"}, flags...), "-o", out, pkg)
	if err := run(ctx, root, "go", args...); err != nil {
		return fmt.Errorf("native module %s: %w", pkg, err)
	}
	return nil
}

// NativeFilter returns the envoy.filters.http.dynamic_modules filter running
// the dynamic module lib<module>.so with the filter name filterName and the
// configuration config (JSON, passed to the module as the bytes of a
// StringValue). The module is never unloaded (do_not_close): a Go runtime
// cannot be. Its metrics are named <metricsNamespace>.<name>
// (metricsNamespace "" keeps Envoy's default, dynamicmodulescustom;
// "wasmcustom" gives filter.wasm's names).
func NativeFilter(module, filterName string, config []byte, metricsNamespace string) M {
	return nativeFilter(M{"name": module}, filterName, config, metricsNamespace)
}

// NativeFilterFile is NativeFilter loading the module from the file path
// (dynamic_module_config.module.local.filename) rather than by name.
func NativeFilterFile(path, filterName string, config []byte, metricsNamespace string) M {
	return nativeFilter(M{"module": M{"local": M{"filename": path}}}, filterName, config, metricsNamespace)
}

// nativeFilter is the filter with dmc, the dynamic_module_config naming the
// module.
func nativeFilter(dmc M, filterName string, config []byte, metricsNamespace string) M {
	dmc["do_not_close"] = true
	if metricsNamespace != "" {
		dmc["metrics_namespace"] = metricsNamespace
	}
	return M{
		"name": "envoy.filters.http.dynamic_modules",
		"typed_config": M{
			"@type":                 "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
			"dynamic_module_config": dmc,
			"filter_name":           filterName,
			"filter_config": M{
				"@type": "type.googleapis.com/google.protobuf.StringValue",
				"value": string(config),
			},
		},
	}
}
