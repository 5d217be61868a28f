// Package mapfile maps model files into memory read-only, for the
// checkpoint readers (safetensors, gguf), which parse the mapping in place.
package mapfile

import (
	"fmt"
	"os"
	"syscall"
)

// Open maps the file at path read-only. A file shorter than min bytes is an
// error that says so (a zero length would also fail the mmap); Unmap
// releases the mapping.
func Open(path string, min int64) (data []byte, unmap func() error, err error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size < max(min, 1) {
		return nil, nil, fmt.Errorf("truncated file: %d bytes, the header alone takes %d", size, max(min, 1))
	}
	if int64(int(size)) != size {
		return nil, nil, fmt.Errorf("%d bytes do not fit the address space", size)
	}
	data, err = syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
