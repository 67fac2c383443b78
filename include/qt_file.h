/* qt_file.h — opening an input that must be a regular file (a config, a data shard, a checkpoint).
 *
 * A FIFO, a socket, a device or a directory given as one would block in open() (a FIFO with no
 * writer), read forever or read garbage: such inputs are refused at once, naming what they are. */
#ifndef QT_FILE_H
#define QT_FILE_H

/* Opens path read-only (O_NONBLOCK, so a FIFO cannot block; cleared once the file is known regular,
 * close-on-exec). Returns the fd; -1 with *why = strerror(errno) when open or fstat failed; -2 with
 * *why = what it is instead ("a FIFO", qt_file_kind) when it is not a regular file. */
int qt_open_regular(const char *path, const char **why);
/* "a FIFO", "a directory", "a socket", "a character device", "a block device" or "a special file"
 * for st_mode m. */
const char *qt_file_kind(unsigned m);

#endif
