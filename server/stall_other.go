//go:build !linux

package server

import "net"

// queuedBytes is not known here: a stream whose client stops reading is
// cancelled when a write blocks past the write timeout.
func queuedBytes(net.Conn) (int, bool) { return 0, false }
