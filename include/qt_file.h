/* qt_file.h — opening an input that must be a regular file (a config, a data shard, a checkpoint).
 *
 * A FIFO, a socket, a device or a directory given as one would block in open() (a FIFO with no
 * writer), read forever or read garbage: such inputs are refused at once, naming what they are. */
#ifndef QT_FILE_H
#define QT_FILE_H

/* Opens path read-only (O_NONBLOCK, so a FIFO cannot block; cleared once the file is known regular,
 * close-on-exec). Returns the fd, or -1 with *why set: strerror(errno) when open or fstat failed, else
 * "not a regular file (a FIFO)" and the like. */
int qt_open_regular(const char *path, const char **why);
/* "a FIFO", "a directory", "a socket", "a character device", "a block device", "a symbolic link" or
 * "not a regular file" for st_mode m. */
const char *qt_file_kind(unsigned m);

#endif
