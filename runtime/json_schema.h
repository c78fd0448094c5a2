/* json_schema — compiles a JSON Schema into grammar nodes (runtime/grammar_build.h), for structured output
 * (response_format json_schema) and tool-call arguments.
 *
 * Supported (anything else is FERRY_ERR_UNSUPPORTED with the keyword and its JSON pointer in err, never
 * ignored): type (one or a list), properties, required, additionalProperties (false, true or a schema),
 * enum, const, items (a schema, or a list as in draft 4-2019 with additionalItems), prefixItems, minItems,
 * maxItems, anyOf, oneOf (generated as anyOf), allOf with one member, $ref to "#", "#/$defs/..",
 * "#/definitions/.." or any JSON pointer into the document (recursion included), pattern (runtime/regex.h),
 * format (date-time, date, time, uuid, email, ipv4, hostname, uri), minLength, maxLength, minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (numbers, or draft-4 booleans), uniqueItems false. Annotations are
 * accepted and ignored: title, description, default, examples, $schema, $id, $comment, $defs,
 * definitions, deprecated, readOnly, writeOnly.
 * Generation is a subset of what the schema accepts: properties appear in the schema's order (required ones
 * always, optional ones when the model writes them), keys not declared are generated only for objects
 * without "properties", numbers with bounds have at most 15 integer and 12 fraction digits.
 * Bounds (FERRY_ERR_RANGE): nesting JSON_SCHEMA_MAX_DEPTH, 64 properties per object, 4096 enum members,
 * minItems 1024, the grammar's node and byte limits.
 */
#ifndef FERRY_JSON_SCHEMA_H
#define FERRY_JSON_SCHEMA_H

#include <stddef.h>

#include "runtime/grammar.h"

#define JSON_SCHEMA_MAX_DEPTH 32

struct gbuilder;

/* Compiles the schema text into nodes of b; *root gets the node of a value that matches it. ws bounds each
 * whitespace run inside objects and arrays. */
int json_schema_compile(struct gbuilder *b, const char *schema, size_t len, int ws, int *root, char err[256]);

/* The whole grammar of one value matching the schema. */
int json_schema_grammar(const char *schema, size_t len, int ws, struct grammar **out, char err[256]);

#endif
