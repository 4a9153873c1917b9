// callbacks.c: Envoy's callbacks, found in the process at load time and
// called through pointers (see dynmod.h for why they are not linked).

#define _GNU_SOURCE
#include <dlfcn.h>

#include "dynmod.h"

#define DM_PREFIX "envoy_dynamic_module_callback_"

// The resolved callbacks, one pointer each; written once by dm_resolve on
// Envoy's main thread before any hook runs, then only read.
#define DM_POINTER(result, name, params, args) result(*name) params;
static struct {
  DM_CALLBACKS(DM_POINTER)
} fn;
#undef DM_POINTER

#define DM_CALL(result, name, params, args) \
  result dm_##name params { return fn.name args; }
DM_CALLBACKS(DM_CALL)
#undef DM_CALL

// The names of the callbacks that were not found, for the error message.
#define DM_MAX_MISSING 64
static const char* missing[DM_MAX_MISSING];

int dm_resolve(void) {
  int n = 0;
#define DM_LOOKUP(result, name, params, args)                         \
  *(void**)(&fn.name) = dlsym(RTLD_DEFAULT, DM_PREFIX #name);          \
  if (fn.name == NULL) {                                              \
    if (n < DM_MAX_MISSING) missing[n] = DM_PREFIX #name;             \
    n++;                                                              \
  }
  DM_CALLBACKS(DM_LOOKUP)
#undef DM_LOOKUP
  return n;
}

const char* dm_missing(int i) {
  if (i < 0 || i >= DM_MAX_MISSING) return "";
  return missing[i];
}
