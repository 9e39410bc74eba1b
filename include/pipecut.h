/*
 * pipecut C ABI: plan an ONNX model's pipeline stages from C, C++ or Python.
 *
 * Hand-written to match src/ffi.rs; tests/ffi.rs checks that every function declared here is
 * exported by libpipecut with the same signature, and compiles tests/c/plan.c against it.
 * See docs/embedding.md for the request fields and examples (C and Python ctypes).
 *
 * Link with -lpipecut (libpipecut.so / .dylib / .dll, or the static libpipecut.a plus the
 * system libraries `cargo rustc --lib --crate-type staticlib -- --print native-static-libs`
 * names, on Linux: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc).
 *
 * Errors: a failed pipecut_plan_json returns NULL; pipecut_last_error() then gives the reason.
 * No function unwinds or aborts on bad input.
 */
#ifndef PIPECUT_H
#define PIPECUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Plans model_bytes (an ONNX protobuf of model_len bytes) as config_json (a NUL-terminated
 * UTF-8 JSON object) asks, and returns the plan JSON (docs/plan-schema.md) as a NUL-terminated
 * string that the caller frees with pipecut_string_free.
 *
 * config_json: {"cluster": "1x4xL4"} or {"devices": "A100-80GB,L4"} or {"cluster_file": PATH},
 * and optionally "dims" {"batch": 8, "seq": 64}, "stages" ("auto" or K), "microbatches" (8),
 * "schedule" ("1f1b" | "gpipe"), "mode" ("inference" | "training"), "memory_headroom" (0.10),
 * "time_limit_secs" (10), "solver" ("auto" | "dp" | "milp"), "unknown_op_cost"
 * ("error" | "zero" | "bytes"), "intra_link", "inter_link", "model_file_name",
 * "external_data_dir", "record_solve_time", "node_secs" ({"node name": measured seconds per
 * micro-batch}), "baseline_layer_type" (the regex of DeepSpeed's type: baseline). Unknown
 * fields are errors.
 *
 * Returns NULL on any error (NULL pointer, invalid UTF-8, bad request, bad model, no plan that
 * fits); pipecut_last_error() then returns the message. The solve stops at about
 * time_limit_secs (default 10 s); the call blocks until then.
 */
char *pipecut_plan_json(const uint8_t *model_bytes, size_t model_len, const char *config_json);

/*
 * The message of the last failed pipecut_plan_json call on the calling thread, or NULL when
 * that call succeeded (or none was made). Owned by pipecut: do not free it; it stays valid
 * until the next pipecut_plan_json call on the same thread.
 */
const char *pipecut_last_error(void);

/* Frees a string returned by pipecut_plan_json; NULL is ignored. */
void pipecut_string_free(char *text);

/* pipecut's version, e.g. "0.1.0". Static: do not free it. */
const char *pipecut_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PIPECUT_H */
