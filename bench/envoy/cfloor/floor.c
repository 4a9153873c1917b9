// floor.c: bench-envoy's setup 2nc, an Envoy dynamic module in C that lets
// every request through and calls nothing back: the cost of Envoy's
// dynamic module hooks alone, without a Go runtime behind them. Beside
// setup 2ne (the same in Go, on filter/native/internal/dynmod) it splits
// the native floor into Envoy's part and the Go runtime's crossings.
// Written from the hooks the binding exports (ABI v0.2.0, Envoy 1.40).
#include "dynmod.h" // the ABI's types (built with -I filter/native/internal/dynmod)

// handles Envoy gives back: any non-zero value
static char config_handle, filter_handle;

const char* envoy_dynamic_module_on_program_init(void) { return "v0.2.0"; }

uintptr_t envoy_dynamic_module_on_http_filter_config_new(void* envoy, dm_buf name, dm_buf config) {
  return (uintptr_t)&config_handle;
}
void envoy_dynamic_module_on_http_filter_config_destroy(uintptr_t h) {}
void envoy_dynamic_module_on_http_filter_config_scheduled(void* envoy, uintptr_t h, uint64_t event) {}
void envoy_dynamic_module_on_http_filter_config_http_callout_done(void* envoy, uintptr_t h, uint64_t id,
                                                                  dm_enum result, dm_header* headers, size_t nh,
                                                                  dm_buf* body, size_t nb) {}

uintptr_t envoy_dynamic_module_on_http_filter_new(uintptr_t config, void* envoy) {
  return (uintptr_t)&filter_handle;
}
dm_enum envoy_dynamic_module_on_http_filter_request_headers(void* envoy, uintptr_t h, bool end) { return 0; }
dm_enum envoy_dynamic_module_on_http_filter_request_body(void* envoy, uintptr_t h, bool end) { return 0; }
dm_enum envoy_dynamic_module_on_http_filter_request_trailers(void* envoy, uintptr_t h) { return 0; }
dm_enum envoy_dynamic_module_on_http_filter_response_headers(void* envoy, uintptr_t h, bool end) { return 0; }
dm_enum envoy_dynamic_module_on_http_filter_response_body(void* envoy, uintptr_t h, bool end) { return 0; }
dm_enum envoy_dynamic_module_on_http_filter_response_trailers(void* envoy, uintptr_t h) { return 0; }
void envoy_dynamic_module_on_http_filter_stream_complete(void* envoy, uintptr_t h) {}
void envoy_dynamic_module_on_http_filter_destroy(uintptr_t h) {}
void envoy_dynamic_module_on_http_filter_http_callout_done(void* envoy, uintptr_t h, uint64_t id, dm_enum result,
                                                           dm_header* headers, size_t nh, dm_buf* body, size_t nb) {}
void envoy_dynamic_module_on_http_filter_scheduled(void* envoy, uintptr_t h, uint64_t event) {}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void* envoy, uintptr_t h, uint64_t id, dm_header* headers,
                                                             size_t n, bool end) {}
void envoy_dynamic_module_on_http_filter_http_stream_data(void* envoy, uintptr_t h, uint64_t id, dm_buf* data, size_t n,
                                                          bool end) {}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void* envoy, uintptr_t h, uint64_t id,
                                                              dm_header* trailers, size_t n) {}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void* envoy, uintptr_t h, uint64_t id) {}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void* envoy, uintptr_t h, uint64_t id, dm_enum reason) {}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void* envoy, uintptr_t h) {}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void* envoy, uintptr_t h) {}
