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
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "lib"+name+".so")
	if err := run(ctx, root, "go", "build", "-buildmode=c-shared", "-o", out, pkg); err != nil {
		return "", fmt.Errorf("native module %s: %w", pkg, err)
	}
	return out, nil
}

// NativeFilter returns the envoy.filters.http.dynamic_modules filter running
// the dynamic module lib<module>.so with the filter name filterName and the
// configuration config (JSON, passed to the module as the bytes of a
// StringValue). The module is never unloaded (do_not_close): a Go runtime
// cannot be. Its metrics are named <metricsNamespace>.<name>
// (metricsNamespace "" keeps Envoy's default, dynamicmodulescustom).
func NativeFilter(module, filterName string, config []byte, metricsNamespace string) M {
	dmc := M{"name": module, "do_not_close": true}
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
