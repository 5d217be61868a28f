//go:build !cgo

package cuda

import (
	"errors"

	"github.com/kiln-llm/kiln/backend"
)

// Options configures a Backend.
type Options struct {
	Device   int
	CacheDir string
}

// Backend is unavailable in builds without cgo; New never returns one.
type Backend struct{ backend.Backend }

// New reports that this build has no CUDA support.
func New(Options) (*Backend, error) {
	return nil, errors.New("cuda: this kiln was built without cgo (CGO_ENABLED=0); rebuild with cgo for GPU support")
}

// FreeMemory is 0 in builds without cgo.
func (b *Backend) FreeMemory() int64 { return 0 }

// NewGroup reports that this build has no CUDA support.
func NewGroup([]int, Options) ([]*Backend, error) {
	_, err := New(Options{})
	return nil, err
}
