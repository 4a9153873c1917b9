// hooks.c: the stream hooks Envoy calls. Each answers in C when Go has
// nothing to do (a hook the stream skips, a stream whose Go side is gone)
// and otherwise calls the Go side (dm_go_*, hooks.go) once.

#include <stdlib.h>

#include "_cgo_export.h"
#include "dynmod.h"

uintptr_t envoy_dynamic_module_on_http_filter_new(uintptr_t config, void* envoy) {
  dm_stream* s = calloc(1, sizeof *s);
  if (s == NULL) {
    return 0;  // Envoy fails the stream's filter chain
  }
  s->envoy = envoy;
  s->config = config;
  return (uintptr_t)s;
}

// live reports whether a hook of s may enter Go: the Go side is not gone
// and the hook (skip bit) is not skipped.
static inline bool live(dm_stream* s, uint32_t skip) { return !s->released && (s->skip & skip) == 0; }

dm_enum envoy_dynamic_module_on_http_filter_request_headers(void* envoy, uintptr_t h, bool end) {
  dm_stream* s = (dm_stream*)h;
  return live(s, 0) ? dm_go_request_headers(s, end) : 0;
}

dm_enum envoy_dynamic_module_on_http_filter_request_body(void* envoy, uintptr_t h, bool end) {
  dm_stream* s = (dm_stream*)h;
  return live(s, DM_SKIP_REQUEST_BODY) ? dm_go_request_body(s, end) : 0;
}

dm_enum envoy_dynamic_module_on_http_filter_request_trailers(void* envoy, uintptr_t h) {
  dm_stream* s = (dm_stream*)h;
  return live(s, DM_SKIP_REQUEST_TRAILERS) ? dm_go_request_trailers(s) : 0;
}

dm_enum envoy_dynamic_module_on_http_filter_response_headers(void* envoy, uintptr_t h, bool end) {
  dm_stream* s = (dm_stream*)h;
  return live(s, DM_SKIP_RESPONSE_HEADERS) ? dm_go_response_headers(s, end) : 0;
}

dm_enum envoy_dynamic_module_on_http_filter_response_body(void* envoy, uintptr_t h, bool end) {
  dm_stream* s = (dm_stream*)h;
  return live(s, DM_SKIP_RESPONSE_BODY) ? dm_go_response_body(s, end) : 0;
}

dm_enum envoy_dynamic_module_on_http_filter_response_trailers(void* envoy, uintptr_t h) {
  dm_stream* s = (dm_stream*)h;
  return live(s, DM_SKIP_RESPONSE_TRAILERS) ? dm_go_response_trailers(s) : 0;
}

void envoy_dynamic_module_on_http_filter_stream_complete(void* envoy, uintptr_t h) {
  dm_stream* s = (dm_stream*)h;
  if (live(s, 0)) {
    dm_go_stream_complete(s);
  }
}

void envoy_dynamic_module_on_http_filter_destroy(uintptr_t h) {
  dm_stream* s = (dm_stream*)h;
  if (!s->released && s->handle != 0) {
    dm_go_destroy(s);
  }
  free(s);
}

void envoy_dynamic_module_on_http_filter_http_callout_done(void* envoy, uintptr_t h, uint64_t id, dm_enum result,
                                                           dm_header* headers, size_t nh, dm_buf* body, size_t nb) {
  dm_stream* s = (dm_stream*)h;
  if (!s->released && s->handle != 0) {
    dm_go_http_callout_done(s, id, result, headers, nh, body, nb);
  }
}

void envoy_dynamic_module_on_http_filter_scheduled(void* envoy, uintptr_t h, uint64_t event) {
  dm_stream* s = (dm_stream*)h;
  if (!s->released && s->handle != 0) {
    dm_go_scheduled(s, event);
  }
}

// Required by Envoy's loader but unused: the module makes no streamed
// callouts and is never a terminal filter, and flow control is Envoy's.

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
