#ifndef C_NGHTTP2_SHIM_H
#define C_NGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>

// NGHTTP2_INITIAL_WINDOW_SIZE is a macro expression the importer drops.
static inline int32_t CNghttp2_initial_window_size(void) { return NGHTTP2_INITIAL_WINDOW_SIZE; }
#endif
