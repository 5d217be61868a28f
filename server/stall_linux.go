package server

import (
	"net"
	"syscall"
	"unsafe"
)

// queuedBytes returns the bytes written to c that its peer has not taken:
// SIOCOUTQ, on TCP those not yet acknowledged, on a Unix socket those not
// yet read.
func queuedBytes(c net.Conn) (int, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int32
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(n), true
}
