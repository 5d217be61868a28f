// mkfixture makes and checks the test fixtures with llama.cpp's own GGUF code
// (libggml-base), so the Go package is tested against the reference
// implementation rather than against itself. Not part of the Go build.
//
//   cc -o /tmp/mkfixture mkfixture.c -I$LLAMA/ggml/include -L$LLAMA/build/bin -lggml-base
//   export LD_LIBRARY_PATH=$LLAMA/build/bin
//   /tmp/mkfixture write llama.gguf && /tmp/mkfixture dump llama.gguf > llama.dump
//   /tmp/mkfixture write llama-a64.gguf 64 && /tmp/mkfixture dump llama-a64.gguf > llama-a64.dump
//   /tmp/mkfixture types > ggml_types.txt
//
// "dump" prints llama.cpp's reading of any file; with GGUF_LLAMA_DUMP=/tmp/mkfixture
// the Go tests also have llama.cpp read the files Write produces.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

static void dump(const char *path) {
    struct gguf_init_params p = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(path, p);
    if (!g) {
        printf("error\n");
        exit(1);
    }
    printf("version %u alignment %zu data_offset %zu\n", gguf_get_version(g), gguf_get_alignment(g), gguf_get_data_offset(g));
    for (int64_t i = 0; i < gguf_get_n_kv(g); i++) {
        enum gguf_type t = gguf_get_kv_type(g, i);
        printf("kv %s %s", gguf_get_key(g, i), gguf_type_name(t));
        if (t == GGUF_TYPE_ARRAY) {
            printf(" %s %zu", gguf_type_name(gguf_get_arr_type(g, i)), gguf_get_arr_n(g, i));
        }
        printf("\n");
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        const int64_t *ne = gguf_get_tensor_ne(g, i);
        printf("tensor %s %s ne %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " offset %zu size %zu\n",
               gguf_get_tensor_name(g, i), ggml_type_name(gguf_get_tensor_type(g, i)), ne[0], ne[1], ne[2], ne[3],
               gguf_get_tensor_offset(g, i), gguf_get_tensor_size(g, i));
    }
    gguf_free(g);
}

static void add(struct ggml_context *c, struct gguf_context *g, const char *name, enum ggml_type t, int n, int64_t ne0,
                int64_t ne1, int64_t ne2, int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    struct ggml_tensor *x = ggml_new_tensor(c, t, n, ne);
    ggml_set_name(x, name);
    uint8_t *d = x->data;
    for (size_t i = 0; i < ggml_nbytes(x); i++) {
        d[i] = (uint8_t)(i * 7 + (unsigned char)name[0]);
    }
    gguf_add_tensor(g, x);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "types") == 0) {
        for (int t = 0; t < GGML_TYPE_COUNT; t++) {
            printf("%d %s %" PRId64 " %zu\n", t, ggml_type_name(t), ggml_blck_size(t), ggml_type_size(t));
        }
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "dump") == 0) {
        dump(argv[2]);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "write") != 0) {
        fprintf(stderr, "usage: mkfixture types | dump FILE | write FILE [ALIGNMENT]\n");
        return 2;
    }
    struct gguf_context *g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "fixture");
    if (argc > 3) {
        gguf_set_val_u32(g, "general.alignment", (uint32_t)atoi(argv[3]));
    }
    gguf_set_val_u8(g, "t.u8", 200);
    gguf_set_val_i8(g, "t.i8", -100);
    gguf_set_val_u16(g, "t.u16", 60000);
    gguf_set_val_i16(g, "t.i16", -30000);
    gguf_set_val_u32(g, "t.u32", 4000000000u);
    gguf_set_val_i32(g, "t.i32", -2000000000);
    gguf_set_val_f32(g, "t.f32", 0.15625f);
    gguf_set_val_bool(g, "t.bool", true);
    gguf_set_val_str(g, "t.str", "héllo\nworld");
    gguf_set_val_str(g, "t.empty", "");
    gguf_set_val_u64(g, "t.u64", 18000000000000000000ull);
    gguf_set_val_i64(g, "t.i64", -9000000000000000000ll);
    gguf_set_val_f64(g, "t.f64", -2.5e-300);
    uint8_t u8s[] = {1, 2, 255};
    int8_t i8s[] = {-1, 0, 127};
    uint16_t u16s[] = {1, 65535};
    int16_t i16s[] = {-32768, 32767};
    uint32_t u32s[] = {7, 4294967295u};
    int32_t i32s[] = {-7, 2147483647, -2147483647 - 1};
    float f32s[] = {1.5f, -0.0f, 3e38f};
    int8_t bools[] = {1, 0, 1};
    uint64_t u64s[] = {18446744073709551615ull, 0};
    int64_t i64s[] = {-1, 9223372036854775807ll};
    double f64s[] = {3.141592653589793, -1e300};
    const char *strs[] = {"a", "", "<|im_start|>", "Ġthe"};
    gguf_set_arr_data(g, "a.u8", GGUF_TYPE_UINT8, u8s, 3);
    gguf_set_arr_data(g, "a.i8", GGUF_TYPE_INT8, i8s, 3);
    gguf_set_arr_data(g, "a.u16", GGUF_TYPE_UINT16, u16s, 2);
    gguf_set_arr_data(g, "a.i16", GGUF_TYPE_INT16, i16s, 2);
    gguf_set_arr_data(g, "a.u32", GGUF_TYPE_UINT32, u32s, 2);
    gguf_set_arr_data(g, "a.i32", GGUF_TYPE_INT32, i32s, 3);
    gguf_set_arr_data(g, "a.f32", GGUF_TYPE_FLOAT32, f32s, 3);
    gguf_set_arr_data(g, "a.bool", GGUF_TYPE_BOOL, bools, 3);
    gguf_set_arr_str(g, "a.str", strs, 4);
    gguf_set_arr_data(g, "a.u64", GGUF_TYPE_UINT64, u64s, 2);
    gguf_set_arr_data(g, "a.i64", GGUF_TYPE_INT64, i64s, 2);
    gguf_set_arr_data(g, "a.f64", GGUF_TYPE_FLOAT64, f64s, 2);
    gguf_set_arr_data(g, "a.empty", GGUF_TYPE_INT32, i32s, 0);

    if (argc > 3) {
        // gguf_set_val_u32 of general.alignment does not change the alignment
        // gguf_add_tensor lays tensors out with; a context read back from a
        // file takes it from the key.
        if (!gguf_write_to_file(g, argv[2], true)) {
            return 1;
        }
        gguf_free(g);
        struct gguf_init_params p = {.no_alloc = true, .ctx = NULL};
        g = gguf_init_from_file(argv[2], p);
        if (!g || gguf_get_alignment(g) != (size_t)atoi(argv[3])) {
            return 1;
        }
    }

    struct ggml_init_params ip = {.mem_size = 1 << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *c = ggml_init(ip);
    add(c, g, "f32", GGML_TYPE_F32, 2, 3, 2, 1, 1);
    add(c, g, "f16", GGML_TYPE_F16, 1, 8, 1, 1, 1);
    add(c, g, "bf16", GGML_TYPE_BF16, 3, 4, 3, 2, 1);
    add(c, g, "i32", GGML_TYPE_I32, 4, 2, 2, 2, 2);
    add(c, g, "q4_0", GGML_TYPE_Q4_0, 2, 32, 3, 1, 1);
    add(c, g, "q8_0", GGML_TYPE_Q8_0, 2, 64, 2, 1, 1);
    add(c, g, "q4_k", GGML_TYPE_Q4_K, 1, 256, 1, 1, 1);
    add(c, g, "q5_k", GGML_TYPE_Q5_K, 1, 256, 1, 1, 1);
    add(c, g, "q6_k", GGML_TYPE_Q6_K, 2, 256, 2, 1, 1);
    add(c, g, "iq2_xxs", GGML_TYPE_IQ2_XXS, 1, 256, 1, 1, 1);
    add(c, g, "mxfp4", GGML_TYPE_MXFP4, 2, 32, 2, 1, 1);
    if (!gguf_write_to_file(g, argv[2], false)) {
        return 1;
    }
    ggml_free(c);
    gguf_free(g);
    return 0;
}
