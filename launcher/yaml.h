/*
 * yaml.h -- the YAML horovodrun's --config-file takes, and no more: a map whose values are
 * scalars or maps of scalars (one level of nesting), with comments, quoted scalars and a
 * "---" start. Anything else (lists, flow style, block scalars, anchors, tags, a third
 * level) is refused with its line number, never misread.
 */
#ifndef KHOR_LAUNCHER_YAML_H
#define KHOR_LAUNCHER_YAML_H

#include <stdbool.h>
#include <stddef.h>

/*
 * One scalar: section is the top-level key it sits under (NULL for a top-level scalar),
 * value its text with quotes taken off (NULL for a section's own line, "key:" with nothing
 * after it). Returns false to stop, with the reason in err.
 */
typedef bool (*yaml_scalar_fn)(void *arg, const char *section, const char *key,
                               const char *value, int line, char *err, size_t errlen);

/* Reads path and calls fn for each scalar in order; false with "PATH:LINE: why" in err. */
bool yaml_read(const char *path, yaml_scalar_fn fn, void *arg, char *err, size_t errlen);

#endif
