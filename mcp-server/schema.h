/* A strict validator for the JSON Schema subset the tool catalog uses:
 * type, properties, required, additionalProperties, enum, pattern,
 * minLength, minimum, maximum, exclusiveMinimum, items. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Returns true when value matches; otherwise writes a message naming the
 * offending path ("limits.memoryMB: must be an integer"). */
bool mcp_schema_validate(const json_t *schema, const json_t *value, char *msg, size_t msglen);
