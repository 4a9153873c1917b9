// dynmod.h: the part of Envoy's dynamic module C ABI that sluice uses,
// declared from the facts of Envoy's abi.h (ABI v0.2.0, Envoy 1.40) in our
// own words. Only layouts and symbol names must match Envoy's: the type names
// here are ours (dm_*).
//
// Envoy's callbacks are not linked: callbacks.c looks each one up in the
// process when the module is loaded (dm_resolve) and calls it through a
// pointer, so that the module refuses to load, naming the callback, on an
// Envoy that lacks one, and so that Go test binaries link without Envoy.
//
// The event hooks (envoy_dynamic_module_on_*) are not declared here: the
// configuration's are Go functions exported by cgo, whose generated
// prototypes would clash; the stream's are in hooks.c.

#ifndef SLUICE_DYNMOD_H
#define SLUICE_DYNMOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A byte range: Envoy's envoy_buffer (owned by Envoy, valid during the hook
// it was given in) and module_buffer (owned by us, read during the call)
// share this layout.
typedef struct {
  const char* ptr;
  size_t length;
} dm_buf;

// A header: envoy_http_header and module_http_header share this layout.
typedef struct {
  const char* key;
  size_t key_length;
  const char* value;
  size_t value_length;
} dm_header;

// Enums cross the ABI as C enums: 4-byte integers.
typedef int32_t dm_enum;

// dm_stream is what Envoy holds for one HTTP stream (the filter's module
// pointer). hooks.c makes it when the stream starts and answers in C the
// hooks that need no Go: every hook that enters Go is a cgo callback, the
// largest part of the module's cost per request. The Go side of the stream
// is made by the first hook that enters Go (handle 0 until then) and may
// be let go when the stream completes (released), so that its destroy hook
// does not enter Go.
typedef struct {
  void* envoy;       // Envoy's filter
  uintptr_t config;  // the configuration's handle
  uintptr_t handle;  // the Go Stream's handle; 0: none (yet, or released)
  uint32_t skip;     // DM_SKIP_*: hooks answered Continue in C
  bool released;     // the Go side is gone: no hook enters Go again
} dm_stream;

// The hooks a stream may skip (dm_stream.skip), as dynmod.Hook names them.
#define DM_SKIP_REQUEST_BODY 1u
#define DM_SKIP_REQUEST_TRAILERS 2u
#define DM_SKIP_RESPONSE_HEADERS 4u
#define DM_SKIP_RESPONSE_BODY 8u
#define DM_SKIP_RESPONSE_TRAILERS 16u

// DM_CALLBACKS lists the callbacks as X(result, name, parameters, arguments);
// name is the symbol without its "envoy_dynamic_module_callback_" prefix.
#define DM_CALLBACKS(X)                                                                           \
  /* logging: any thread */                                                                       \
  X(void, log, (dm_enum level, dm_buf message), (level, message))                                 \
  X(bool, log_enabled, (dm_enum level), (level))                                                  \
  X(dm_enum, get_log_level, (void), ())                                                           \
  /* the process: main thread */                                                                  \
  X(uint32_t, get_concurrency, (void), ())                                                        \
  /* metrics: defined in on_http_filter_config_new only (then frozen), updated from any thread */ \
  X(dm_enum, http_filter_config_define_counter,                                                   \
    (void* config, dm_buf name, dm_buf* labels, size_t label_count, size_t* id),                  \
    (config, name, labels, label_count, id))                                                      \
  X(dm_enum, http_filter_config_define_gauge,                                                     \
    (void* config, dm_buf name, dm_buf* labels, size_t label_count, size_t* id),                  \
    (config, name, labels, label_count, id))                                                      \
  X(dm_enum, http_filter_config_increment_counter,                                                \
    (void* config, size_t id, dm_buf* values, size_t value_count, uint64_t n),                    \
    (config, id, values, value_count, n))                                                         \
  X(dm_enum, http_filter_config_set_gauge,                                                        \
    (void* config, size_t id, dm_buf* values, size_t value_count, uint64_t n),                    \
    (config, id, values, value_count, n))                                                         \
  X(dm_enum, http_filter_config_increment_gauge,                                                  \
    (void* config, size_t id, dm_buf* values, size_t value_count, uint64_t n),                    \
    (config, id, values, value_count, n))                                                         \
  X(dm_enum, http_filter_config_decrement_gauge,                                                  \
    (void* config, size_t id, dm_buf* values, size_t value_count, uint64_t n),                    \
    (config, id, values, value_count, n))                                                         \
  /* headers and trailers: the stream's worker, in a hook */                                      \
  X(bool, http_get_header,                                                                        \
    (void* filter, dm_enum kind, dm_buf key, dm_buf* value, size_t index, size_t* count),         \
    (filter, kind, key, value, index, count))                                                     \
  X(size_t, http_get_headers_size, (void* filter, dm_enum kind), (filter, kind))                  \
  X(bool, http_get_headers, (void* filter, dm_enum kind, dm_header* out), (filter, kind, out))    \
  X(bool, http_add_header, (void* filter, dm_enum kind, dm_buf key, dm_buf value),                \
    (filter, kind, key, value))                                                                   \
  X(bool, http_set_header, (void* filter, dm_enum kind, dm_buf key, dm_buf value),                \
    (filter, kind, key, value))                                                                   \
  /* bodies: the stream's worker, in a hook */                                                    \
  X(size_t, http_get_body_size, (void* filter, dm_enum kind), (filter, kind))                     \
  X(size_t, http_get_body_chunks_size, (void* filter, dm_enum kind), (filter, kind))              \
  X(bool, http_get_body_chunks, (void* filter, dm_enum kind, dm_buf* out), (filter, kind, out))   \
  X(bool, http_drain_body, (void* filter, dm_enum kind, size_t n), (filter, kind, n))             \
  X(bool, http_append_body, (void* filter, dm_enum kind, dm_buf data), (filter, kind, data))      \
  /* the stream's course: its worker, in a hook */                                                \
  X(void, http_send_response,                                                                     \
    (void* filter, uint32_t status, dm_header* headers, size_t header_count, dm_buf body,         \
     dm_buf details),                                                                             \
    (filter, status, headers, header_count, body, details))                                       \
  X(void, http_filter_continue_decoding, (void* filter), (filter))                                \
  X(void, http_filter_continue_encoding, (void* filter), (filter))                                \
  X(uint32_t, http_filter_get_worker_index, (void* filter), (filter))                             \
  /* attributes and metadata: the stream's worker, in a hook */                                   \
  X(bool, http_filter_get_attribute_string, (void* filter, dm_enum id, dm_buf* out),              \
    (filter, id, out))                                                                            \
  X(bool, http_filter_get_attribute_int, (void* filter, dm_enum id, uint64_t* out),               \
    (filter, id, out))                                                                            \
  X(bool, http_get_metadata_number,                                                               \
    (void* filter, dm_enum source, dm_buf ns, dm_buf key, double* out),                           \
    (filter, source, ns, key, out))                                                               \
  X(bool, http_get_metadata_string,                                                               \
    (void* filter, dm_enum source, dm_buf ns, dm_buf key, dm_buf* out),                           \
    (filter, source, ns, key, out))                                                               \
  X(void, http_set_dynamic_metadata_number, (void* filter, dm_buf ns, dm_buf key, double value),  \
    (filter, ns, key, value))                                                                     \
  X(void, http_set_dynamic_metadata_string, (void* filter, dm_buf ns, dm_buf key, dm_buf value),  \
    (filter, ns, key, value))                                                                     \
  /* HTTP callouts to a cluster: the stream's worker, or the main thread for a config's */        \
  X(dm_enum, http_filter_http_callout,                                                            \
    (void* filter, uint64_t* id, dm_buf cluster, dm_header* headers, size_t header_count,         \
     dm_buf body, uint64_t timeout_ms),                                                           \
    (filter, id, cluster, headers, header_count, body, timeout_ms))                               \
  X(dm_enum, http_filter_config_http_callout,                                                     \
    (void* config, uint64_t* id, dm_buf cluster, dm_header* headers, size_t header_count,         \
     dm_buf body, uint64_t timeout_ms),                                                           \
    (config, id, cluster, headers, header_count, body, timeout_ms))                               \
  /* schedulers: made on the owner's thread, committed from any thread */                        \
  X(void*, http_filter_scheduler_new, (void* filter), (filter))                                   \
  X(void, http_filter_scheduler_commit, (void* scheduler, uint64_t event), (scheduler, event))    \
  X(void, http_filter_scheduler_delete, (void* scheduler), (scheduler))                           \
  X(void*, http_filter_config_scheduler_new, (void* config), (config))                            \
  X(void, http_filter_config_scheduler_commit, (void* scheduler, uint64_t event),                 \
    (scheduler, event))                                                                           \
  X(void, http_filter_config_scheduler_delete, (void* scheduler), (scheduler))

// dm_NAME calls Envoy's callback NAME; valid once dm_resolve returned 0.
#define DM_DECLARE(result, name, params, args) result dm_##name params;
DM_CALLBACKS(DM_DECLARE)
#undef DM_DECLARE

// dm_resolve looks every callback up in the process and returns how many are
// missing; dm_missing(i) names the i-th missing one.
int dm_resolve(void);
const char* dm_missing(int i);

#endif
