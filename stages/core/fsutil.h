/*
 * stages/core/fsutil.h — small file-system helpers: the atomic small-file writer used for resume
 * state, mkdir -p, whole-file reads, and the run directory of design.md §3.
 *
 * All functions return 0 (or a value) on success and -1 with a sentence in `err` on failure; none
 * exits. The atomic writer writes `<path>.tmp.<pid>`, fsyncs it, renames it over `path` and fsyncs
 * the directory, so a reader sees the old or the new content, never a torn file, even after
 * SIGKILL or power loss.
 */
#ifndef STAGES_CORE_FSUTIL_H
#define STAGES_CORE_FSUTIL_H

#include <stddef.h>

int fs_write_atomic(const char *path, const void *data, size_t len, char *err, int err_len);
/* Read a whole file into a malloc'd, NUL-terminated buffer (*out, caller frees); *len excludes the NUL. */
int fs_read_file(const char *path, char **out, size_t *len, char *err, int err_len);
/* mkdir -p with mode 0755. Existing directories are fine. */
int fs_mkdir_p(const char *path, char *err, int err_len);
int fs_exists(const char *path);
/* fsync the directory dir, or the directory holding path, so that a create or rename inside it survives a
 * crash. 0, or -1 with a sentence naming the directory. */
int fs_fsync_dir(const char *dir, char *err, int err_len);
int fs_fsync_parent(const char *path, char *err, int err_len);

/* Permissions of what stages create in a run directory (issue 14 item 9): private by default,
 * directories 0700 and files 0600; with fs_set_share_group(1) (stage flag --share-group)
 * group-readable, 0750 and 0640. Process-wide; set once at start-up (stage_start), before
 * other threads run. */
void fs_set_share_group(int on);
unsigned fs_dir_mode(void);
unsigned fs_file_mode(void);

/* Create the temporary file tmp for writing, private (fs_file_mode()): a file or symlink already at that name is
 * removed first and the new one made with O_EXCL | O_NOFOLLOW, so nothing planted there is written through.
 * Returns the fd (O_CLOEXEC) or -1 with errno set. */
int fs_create_tmp(const char *tmp);

/* Open (creating, private) a state file read-write without following a symlink at path. fd or -1 (errno). */
int fs_open_state(const char *path);

/* Create the run directory layout (run dir, bus/, logs/, state/, checkpoints/, export/, plots/)
 * with fs_dir_mode() (set exactly with chmod on what this call creates, whatever the umask; the
 * parents of the run directory get mkdir -p's 0755). Whoever comes first creates it; concurrent
 * callers are fine. Refuses, with one sentence, a run directory that is not a directory or is
 * owned by another user (its files would be written into someone else's tree). */
int run_dir_init(const char *run_dir, char *err, int err_len);
/* Join run_dir and a relative path into out (size out_len). Returns -1 if it does not fit. */
int run_path(char *out, size_t out_len, const char *run_dir, const char *rel);
/* The run id used in shared-memory names: the basename of the run directory's real path, with
 * characters outside [A-Za-z0-9_-] replaced by '_', plus a short hash of the full path so two runs
 * with the same basename do not collide. */
int run_id(const char *run_dir, char *out, size_t out_len, char *err, int err_len);

/* Monotonic and wall-clock seconds. */
double time_mono_s(void);
double time_wall_s(void);

#endif /* STAGES_CORE_FSUTIL_H */
