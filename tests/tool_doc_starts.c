/* tool_doc_starts.c — prints the document starts the loader hands out for each window of a shard, in
 * file order, for tests/test_tokenize_docs.py:
 *   tool_doc_starts SHARD SEQ_LEN
 * One line per window: the window index, then its start positions (qt_loader_next_docs). */
#include <stdio.h>
#include <stdlib.h>

#include "qt_data.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: tool_doc_starts SHARD SEQ_LEN\n");
        return 2;
    }
    int T = atoi(argv[2]);
    char err[1024];
    qt_loader *l = qt_loader_open(argv[1], T, 1, 0, 1, 0, 0, 0, err, sizeof err);
    if (!l) {
        fprintf(stderr, "tool_doc_starts: %s\n", err);
        return 1;
    }
    int32_t *buf = malloc(3 * (size_t)T * sizeof *buf), n = 0;
    int rc = buf ? 0 : 1;
    for (uint64_t w = 0; rc == 0 && w < qt_loader_windows(l); w++) {
        if (qt_loader_next_docs(l, buf, buf + T, buf + 2 * T, &n, err, sizeof err)) {
            fprintf(stderr, "tool_doc_starts: %s\n", err);
            rc = 1;
            break;
        }
        printf("%llu", (unsigned long long)w);
        for (int k = 0; k < n; k++) printf(" %d", buf[2 * T + k]);
        printf("\n");
    }
    free(buf);
    qt_loader_free(l);
    return rc;
}
