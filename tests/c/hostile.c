/*
 * Hostile requests through the C ABI, as an embedding program would send them (built and run by
 * tests/ffi.rs, on fixtures/models/mlp.onnx).
 *
 *   hostile MODEL.onnx [CLUSTER.json]
 *
 * One line per request on stdout; exit 0 when every one failed cleanly. CLUSTER.json, a cluster
 * file of millions of devices made by the test, is sent as one more request's "cluster_file"
 * (it aborted the host: every device's profile was built before the count was checked).
 *
 * The process first caps its own address space at 4 GiB (setrlimit), so that a request which
 * sizes an allocation by a number in it cannot succeed by luck on a large machine: pipecut must
 * return NULL with a message naming the problem, not abort the program (issue 18, items 3 and 7).
 */
#define _XOPEN_SOURCE 700

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "pipecut.h"

struct hostile_request {
    const char *what;
    const char *config_json;
    const char *expected_error;
};

static const struct hostile_request REQUESTS[] = {
    {"u32::MAX micro-batches (allocated 103 GB and aborted)",
     "{\"devices\": \"H100-SXM,H100-SXM\", \"dims\": {\"batch\": 8}, \"stages\": 2, "
     "\"microbatches\": 4294967295}",
     "over pipecut's limit of 65536"},
    {"u32::MAX micro-batches, stage count chosen by simulation",
     "{\"devices\": \"H100-SXM,H100-SXM\", \"dims\": {\"batch\": 8}, \"stages\": \"auto\", "
     "\"microbatches\": 4294967295}",
     "over pipecut's limit of 65536"},
    {"node times of 1e308 on 4 nodes (summed to infinity: bottleneck_secs null)",
     "{\"devices\": \"H100-SXM,H100-SXM\", \"dims\": {\"batch\": 8}, \"stages\": 2, "
     "\"node_secs\": {\"/layers/layers.0/Gemm\": 1e308, \"/layers/layers.2/Gemm\": 1e308, "
     "\"/layers/layers.4/Gemm\": 1e308, \"/layers/layers.6/Gemm\": 1e308}}",
     "node times sum to inf"},
    {"a node time beyond f64 (parsed as infinity)",
     "{\"devices\": \"H100-SXM\", \"dims\": {\"batch\": 8}, "
     "\"node_secs\": {\"/head/Gemm\": 1e999}}",
     "config_json"},
    {"a batch of 2^64 - 1",
     "{\"devices\": \"H100-SXM\", \"dims\": {\"batch\": 18446744073709551615}}",
     "more elements than fit in 64 bits"},
};

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

/* One request: 0 when it failed with a message containing `expected_error`. */
static int refused(const unsigned char *model, size_t len, const char *what,
                   const char *config_json, const char *expected_error) {
    char *plan = pipecut_plan_json(model, len, config_json);
    const char *message = pipecut_last_error();
    if (plan != NULL) {
        fprintf(stderr, "%s: expected NULL, got a plan:\n%s\n", what, plan);
        pipecut_string_free(plan);
        return 1;
    }
    if (message == NULL || strstr(message, expected_error) == NULL) {
        fprintf(stderr, "%s: expected an error containing '%s', got '%s'\n", what,
                expected_error, message ? message : "(NULL)");
        return 1;
    }
    printf("refused: %s: %s\n", what, message);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s MODEL.onnx [CLUSTER.json]\n", argv[0]);
        return 2;
    }
    const struct rlimit cap = {4UL << 30, 4UL << 30};
    if (setrlimit(RLIMIT_AS, &cap) != 0) {
        perror("setrlimit(RLIMIT_AS, 4 GiB)");
        return 2;
    }
    size_t len = 0;
    unsigned char *model = read_file(argv[1], &len);
    if (model == NULL) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }
    int failures = 0;
    for (size_t i = 0; i < sizeof REQUESTS / sizeof REQUESTS[0]; i++) {
        const struct hostile_request *r = &REQUESTS[i];
        failures += refused(model, len, r->what, r->config_json, r->expected_error);
    }
    if (argc == 3) {
        char config[4096];
        int n = snprintf(config, sizeof config,
                         "{\"cluster_file\": \"%s\", \"dims\": {\"batch\": 8}}", argv[2]);
        if (n < 0 || (size_t)n >= sizeof config || strchr(argv[2], '"') != NULL) {
            fprintf(stderr, "the cluster file's path does not fit a JSON string here\n");
            return 2;
        }
        failures += refused(model, len, "a cluster file of millions of devices", config,
                            "more than pipecut plans for");
    }
    free(model);
    return failures == 0 ? 0 : 1;
}
