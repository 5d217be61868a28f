package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ListenUnix listens on a Unix socket at path that only the current user
// may use: the socket is created with mode 0600 (under a umask that leaves
// no window where it is wider), and every accepted connection's peer uid is
// checked with SO_PEERCRED, so that even a process that can reach the file
// (root, or a too-open mode set later) is refused unless it runs as the
// owner. The directory must exist. A stale socket from a crashed server is
// replaced; a live one is an error.
func ListenUnix(path string, log *slog.Logger) (net.Listener, error) {
	if log == nil {
		log = slog.Default()
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another server is already listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale socket: %w", err)
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	// Close removes the socket file itself, and only while it is still the
	// one made here: a server draining after SIGTERM must not remove the
	// socket of the server that replaced it (as net's unlink on close, or a
	// plain os.Remove at exit, would), or kiln status, chat and stop lose a
	// server that is running.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	err = os.Chmod(path, 0o600)
	var id fileID
	if err == nil {
		id, err = socketID(path) // after the chmod, which changes its ctime
	}
	if err != nil {
		l.Close()
		os.Remove(path)
		return nil, err
	}
	return &ownerListener{Listener: l, uid: uint32(os.Getuid()), log: log, path: path, id: id}, nil
}

// fileID tells one file at a path from another made there later: the inode
// (which a file made after the first was removed may reuse) and the time
// it changed.
type fileID struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

func socketID(path string) (fileID, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("%s: no inode", path)
	}
	return fileID{uint64(st.Dev), st.Ino, st.Ctim}, nil
}

// ownerListener accepts only connections from processes running as uid.
type ownerListener struct {
	net.Listener
	uid    uint32
	log    *slog.Logger
	path   string
	id     fileID
	remove sync.Once
}

// Close stops listening and removes the socket file if it is still this
// listener's.
func (l *ownerListener) Close() error {
	err := l.Listener.Close()
	l.remove.Do(func() {
		if id, serr := socketID(l.path); serr == nil && id == l.id {
			os.Remove(l.path)
		}
	})
	return err
}

func (l *ownerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && uid == l.uid {
			return c, nil
		}
		if err == nil {
			err = fmt.Errorf("peer uid %d is not the owner's (%d)", uid, l.uid)
		}
		l.log.Warn("refused a Unix-socket connection", "err", err)
		c.Close()
	}
}

// peerUID returns the uid of the process at the other end of a Unix socket.
func peerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, errors.New("not a Unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred.Uid, nil
}

// DefaultSocketDir is where the daemon's socket, pid and log files live:
// $XDG_RUNTIME_DIR/kiln, else ~/.kiln.
func DefaultSocketDir() (string, error) {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kiln"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no $XDG_RUNTIME_DIR and no home directory: %w", err)
	}
	return filepath.Join(home, ".kiln"), nil
}

// PrivateDir creates dir (and its parents) if needed and makes it 0700, so
// that nobody else can reach the socket and files in it.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}
