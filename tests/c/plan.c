/*
 * Plans a model through the C ABI, as an embedding program would (built and run by tests/ffi.rs).
 *
 *   plan MODEL.onnx CONFIG_JSON      prints the plan JSON on stdout; exit 0
 *
 * Before planning it checks the error paths a C caller can reach: NULL arguments, a config that
 * is not UTF-8, and that pipecut_last_error() is NULL after a success. A failed check or plan
 * prints the reason on stderr and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipecut.h"

static int expect_error(const char *what, char *plan, const char *needle) {
    const char *message = pipecut_last_error();
    if (plan != NULL) {
        fprintf(stderr, "%s: expected NULL, got a plan\n", what);
        pipecut_string_free(plan);
        return 1;
    }
    if (message == NULL || strstr(message, needle) == NULL) {
        fprintf(stderr, "%s: expected an error containing '%s', got '%s'\n", what, needle,
                message ? message : "(NULL)");
        return 1;
    }
    return 0;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        return NULL;
    }
    unsigned char *bytes = NULL;
    if (fseek(file, 0, SEEK_END) == 0) {
        long size = ftell(file);
        if (size >= 0 && fseek(file, 0, SEEK_SET) == 0) {
            bytes = malloc(size > 0 ? (size_t)size : 1);
            if (bytes != NULL && fread(bytes, 1, (size_t)size, file) != (size_t)size) {
                free(bytes);
                bytes = NULL;
            }
            *len = (size_t)size;
        }
    }
    fclose(file);
    return bytes;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.onnx CONFIG_JSON\n", argv[0]);
        return 2;
    }
    size_t len = 0;
    unsigned char *model = read_file(argv[1], &len);
    if (model == NULL) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }

    int failures = 0;
    failures += expect_error("NULL model", pipecut_plan_json(NULL, 0, argv[2]), "model_bytes");
    failures += expect_error("NULL config", pipecut_plan_json(model, len, NULL), "config_json");
    const char not_utf8[] = {'{', '"', (char)0xff, '"', '}', 0};
    failures += expect_error("non-UTF-8 config", pipecut_plan_json(model, len, not_utf8), "UTF-8");
    failures += expect_error("truncated model", pipecut_plan_json(model, len / 2, argv[2]),
                             "ONNX");
    pipecut_string_free(NULL);

    char *plan = pipecut_plan_json(model, len, argv[2]);
    free(model);
    if (plan == NULL) {
        const char *message = pipecut_last_error();
        fprintf(stderr, "pipecut_plan_json failed: %s\n", message ? message : "(no message)");
        return 1;
    }
    if (pipecut_last_error() != NULL) {
        fprintf(stderr, "pipecut_last_error() is not NULL after a success\n");
        failures += 1;
    }
    fputs(plan, stdout);
    pipecut_string_free(plan);
    fprintf(stderr, "pipecut %s: planned %zu bytes of model\n", pipecut_version(), len);
    return failures == 0 ? 0 : 1;
}
