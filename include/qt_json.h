/* qt_json.h — a small JSON reader (config.json, safetensors headers) and nothing more.
 * The whole document is parsed into a tree of nodes owned by one qt_json; strings are unescaped. */
#ifndef QT_JSON_H
#define QT_JSON_H

#include <stddef.h>

typedef enum { QT_JSON_NULL, QT_JSON_BOOL, QT_JSON_NUM, QT_JSON_STR, QT_JSON_ARR, QT_JSON_OBJ } qt_json_type;

typedef struct qt_json_node {
    qt_json_type type;
    double num;              /* NUM, BOOL (0/1) */
    char *str;               /* STR */
    char *key;               /* member name when the parent is an object */
    struct qt_json_node *child, *next; /* first child / next sibling */
    size_t begin, end;       /* byte range of the value in the text */
} qt_json_node;

typedef struct qt_json qt_json;

/* Parses text[0:n]. NULL with err ("offset 123: expected ':'") on a syntax error. */
qt_json *qt_json_parse(const char *text, size_t n, char *err, size_t errlen);
const qt_json_node *qt_json_root(const qt_json *j);
/* Member of an object by name, or NULL. */
const qt_json_node *qt_json_get(const qt_json_node *obj, const char *key);
void qt_json_free(qt_json *j);

#endif
