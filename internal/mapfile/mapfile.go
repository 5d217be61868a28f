// Package mapfile opens model files: maps the checkpoints read-only for
// their readers (safetensors, gguf), which parse the mapping in place, and
// reads the small files beside them (config.json, tokenizer.json, ...).
// Both refuse what is not a regular file: reading a named pipe in place of
// the weights would wait forever, a device would never end.
package mapfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Open maps the file at path read-only. A file shorter than min bytes is an
// error that says so (a zero length would also fail the mmap); Unmap
// releases the mapping.
func Open(path string, min int64) (data []byte, unmap func() error, err error) {
	// O_NONBLOCK: opening a named pipe would otherwise wait for a writer
	// before Stat could refuse it. Reads of a regular file ignore it.
	fd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, err
	}
	if err := regular(st); err != nil {
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
	m := &mapping{path: path, start: uintptr(unsafe.Pointer(unsafe.SliceData(data))), size: uintptr(len(data))}
	live.Lock()
	live.maps[m] = true
	live.Unlock()
	return data, func() error {
		live.Lock()
		delete(live.maps, m)
		live.Unlock()
		return syscall.Munmap(data)
	}, nil
}

// mapping is one live mapping, for Containing.
type mapping struct {
	path        string
	start, size uintptr
}

var live = struct {
	sync.Mutex
	maps map[*mapping]bool
}{maps: map[*mapping]bool{}}

// Containing returns the path of the mapped file that holds address addr:
// a memory fault there means the file was truncated or rewritten in place
// while it was mapped (runtime/debug.SetPanicOnFault gives the address).
func Containing(addr uintptr) (string, bool) {
	live.Lock()
	defer live.Unlock()
	for m := range live.maps {
		if addr >= m.start && addr-m.start < m.size {
			return m.path, true
		}
	}
	return "", false
}

// ReadFile reads the file at path whole, refusing one that is not a
// regular file or is over limit bytes. Errors name the file.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f, path, limit)
}

// ReadFS is ReadFile of the file name of fsys.
func ReadFS(fsys fs.FS, name string, limit int64) ([]byte, error) {
	// Stat before opening: os.DirFS opens without O_NONBLOCK.
	st, err := fs.Stat(fsys, name)
	if err != nil {
		return nil, err
	}
	if err := check(st, name, limit); err != nil {
		return nil, err
	}
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f, name, limit)
}

func read(f fs.File, name string, limit int64) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(st, name, limit); err != nil {
		return nil, err
	}
	// The file may have grown since Stat.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes allowed", name, limit)
	}
	return data, nil
}

func check(st fs.FileInfo, name string, limit int64) error {
	if err := regular(st); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if st.Size() > limit {
		return fmt.Errorf("%s: %d bytes, more than the %d allowed", name, st.Size(), limit)
	}
	return nil
}

func regular(st fs.FileInfo) error {
	if st.Mode().IsRegular() {
		return nil
	}
	kind := "a special file"
	switch m := st.Mode(); {
	case m.IsDir():
		kind = "a directory"
	case m&fs.ModeNamedPipe != 0:
		kind = "a named pipe"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	case m&fs.ModeDevice != 0:
		kind = "a device"
	}
	return fmt.Errorf("not a regular file (%s)", kind)
}
