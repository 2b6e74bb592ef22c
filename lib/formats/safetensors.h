/* formats/: the files of the Hugging Face world, read and written.
 *
 * Owns: safetensors (safetensors.h), config.json (hf_config.h), PEFT's
 * adapter_config.json (lora.h), bitsandbytes' quantized state dicts (quant_io.h),
 * TensorBoard event files (tb_writer.h), where a model named by a path or a Hub id
 * lives (model_path.h), and how the JSON files of a model dir are read (json_file.h).
 * May call: core, quant.
 * (This is the folder's main header.) */

/* safetensors: read (mmap, lazy, fully validated) and write (atomic), single files and
 * sharded checkpoints (model.safetensors.index.json).
 *
 * File layout: u64 LE header length N; N bytes of UTF-8 JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}};
 * then the data buffer, offsets relative to its start. Reading rejects everything the
 * reference reader rejects (see ../shared/FORMATS.md): header over 100,000,000 bytes,
 * header past the end, bad JSON or schema, unknown dtype, offsets with gaps or overlaps,
 * byte length != prod(shape) x dtype size, trailing bytes. Errors name the file and the
 * tensor. */
#ifndef FT_SAFETENSORS_H
#define FT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/ft_error.h"

typedef enum ft_st_dtype {
    FT_ST_BOOL = 0,
    FT_ST_U8,
    FT_ST_I8,
    FT_ST_F8_E5M2,
    FT_ST_F8_E4M3,
    FT_ST_I16,
    FT_ST_U16,
    FT_ST_F16,
    FT_ST_BF16,
    FT_ST_I32,
    FT_ST_U32,
    FT_ST_F32,
    FT_ST_F64,
    FT_ST_I64,
    FT_ST_U64,
    FT_ST_NDTYPES
} ft_st_dtype;

#define FT_ST_MAX_DIMS 8

typedef struct ft_st_tensor {
    char *name;
    ft_st_dtype dtype;
    int ndim;
    int64_t shape[FT_ST_MAX_DIMS];
    size_t numel;
    size_t nbytes;
    const void *data; /* into the file's mapping; valid until the file is closed */
    const char *file; /* path of the file holding it (for messages) */
} ft_st_tensor;

typedef struct ft_st_file ft_st_file;

/* "F32", "BF16", ...; NULL for an out-of-range value. */
const char *ft_st_dtype_name(ft_st_dtype dt);
/* Parses a dtype name (case-sensitive); -1 if unknown. */
int ft_st_dtype_parse(const char *name);
size_t ft_st_dtype_size(ft_st_dtype dt);

/* Opens and validates one file (mmap'ed read-only). On error *out is NULL. */
int ft_st_open(ft_st_file **out, const char *path, ft_err *err);
void ft_st_close(ft_st_file *f);
size_t ft_st_count(const ft_st_file *f);
const ft_st_tensor *ft_st_at(const ft_st_file *f, size_t i);
const ft_st_tensor *ft_st_find(const ft_st_file *f, const char *name);
/* Value of __metadata__[key], or NULL. */
const char *ft_st_metadata(const ft_st_file *f, const char *key);

/* Copies tensor t into dst as fp32 (F32, F16 and BF16 are converted; other dtypes are
 * an error naming the tensor). n must equal t->numel. */
int ft_st_to_f32(const ft_st_tensor *t, float *dst, size_t n, ft_err *err);

/* ft_st_to_f32 for values that must be finite (weights): a NaN or an infinity is an error
 * naming the file, the tensor and the first such element ("element [3, 5] is NaN"),
 * found in the conversion's own pass. dst is then partly written. */
int ft_st_to_f32_finite(const ft_st_tensor *t, float *dst, size_t n, ft_err *err);

/* The first element of the n fp32 values at p (any alignment) that is NaN or infinite, or
 * n if all are finite. */
size_t ft_f32_first_nonfinite(const void *p, size_t n);

/* ---- checkpoints: a directory with model.safetensors, or with
 * model.safetensors.index.json and its shards. `basename` is "model" for models,
 * "adapter_model" for PEFT adapters. Every shard named by the index is opened and
 * validated; a weight_map entry missing from its shard is an error. The single file
 * wins when both exist. With an index, the checkpoint's tensors are the weight_map's
 * entries (shard by shard, in file order); a shard name must be a plain file name
 * (no '/' or ".."); metadata.total_size is not checked. */
typedef struct ft_checkpoint ft_checkpoint;
int ft_ckpt_open(ft_checkpoint **out, const char *dir, const char *basename, ft_err *err);
void ft_ckpt_close(ft_checkpoint *c);
/* NULL if absent. */
const ft_st_tensor *ft_ckpt_find(const ft_checkpoint *c, const char *name);
size_t ft_ckpt_count(const ft_checkpoint *c);
const ft_st_tensor *ft_ckpt_at(const ft_checkpoint *c, size_t i);

/* ---- writing. The writer keeps pointers to the caller's data (not copies) until
 * ft_st_writer_free; tensors are written sorted as the reference writer does, header
 * padded with spaces to a multiple of 8. Files are written to "<path>.tmp" and renamed,
 * so a reader never sees a partial file. */
typedef struct ft_st_writer ft_st_writer;
ft_st_writer *ft_st_writer_new(void);
void ft_st_writer_free(ft_st_writer *w);
int ft_st_writer_add(ft_st_writer *w, const char *name, ft_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, ft_err *err);
/* Hands buf (malloc'd) to the writer, which frees it with itself: for data that must
 * live until the save (on failure buf stays the caller's). */
int ft_st_writer_keep(ft_st_writer *w, void *buf);
int ft_st_writer_metadata(ft_st_writer *w, const char *key, const char *value,
                          ft_err *err);
/* How many tensors have been added, and their data bytes (headers not counted). */
size_t ft_st_writer_count(const ft_st_writer *w);
size_t ft_st_writer_bytes(const ft_st_writer *w);
/* Keeps the tensors added from index first on (first < count) together: a sharded save
 * puts them into one shard, as loaders that read a quantized weight's parts (the packed
 * data, absmax, quant_state, ...) from one shard need. */
void ft_st_writer_group(ft_st_writer *w, size_t first);
int ft_st_writer_save(const ft_st_writer *w, const char *path, ft_err *err);
/* Saves into dir as <basename>.safetensors, or, when the data exceed max_shard_bytes,
 * as <basename>-0000i-of-0000n.safetensors plus <basename>.safetensors.index.json.
 * Greedy split in insertion order, a group (ft_st_writer_group) counting as one tensor;
 * a tensor or group larger than max_shard_bytes (> 0) gets a shard of its own; metadata
 * goes into every shard. Files of an earlier save in the other layout (the plain file,
 * the index, shards of another count) are removed. */
int ft_st_writer_save_sharded(const ft_st_writer *w, const char *dir, const char *basename,
                              size_t max_shard_bytes, ft_err *err);

/* fp16 / bf16 <-> fp32 conversions (round to nearest even on the way down). */
float ft_bf16_to_f32(uint16_t h);
float ft_f16_to_f32(uint16_t h);
uint16_t ft_f32_to_bf16(float f);
uint16_t ft_f32_to_f16(float f);

#endif
