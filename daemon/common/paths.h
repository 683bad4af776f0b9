/*
 * paths.h — default locations shared by m6d and m6ctl.
 *
 * State dir: $M6_STATE_DIR, else $STATE_DIRECTORY (systemd StateDirectory=,
 * first entry), else $XDG_STATE_HOME/m6, else ~/.local/state/m6. The control socket defaults to
 * <state dir>/m6d.sock; m6ctl also looks at /run/m6d/m6d.sock (the systemd
 * unit's RuntimeDirectory) when the per-user one isn't there.
 */
#ifndef M6_PATHS_H
#define M6_PATHS_H

#include <stddef.h>
#include <sys/types.h>

#define M6_SYSTEM_SOCKET "/run/m6d/m6d.sock"

/* 0, or -1 when no HOME or the result doesn't fit. */
int paths_state_dir(char *buf, size_t len);
int paths_socket_in(const char *state_dir, char *buf, size_t len);
/* m6ctl: $M6_SOCKET, else the per-user default, else the system one. */
int paths_client_socket(char *buf, size_t len);
/* mkdir -p: the parents 0755, path itself with mode; existing ones are fine.
 * 0, or -1 with errno set (ENAMETOOLONG when path is 4096 bytes or more). */
int paths_mkdir_p(const char *path, mode_t mode);

#endif /* M6_PATHS_H */
