//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// kernelSource concatenates the embedded kernel files (the header first) into
// one translation unit, so that one module holds every kernel.
func kernelSource() (string, error) {
	ents, err := kernelFS.ReadDir("kernels")
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Slice(names, func(i, j int) bool {
		hi, hj := strings.HasSuffix(names[i], ".cuh"), strings.HasSuffix(names[j], ".cuh")
		if hi != hj {
			return hi
		}
		return names[i] < names[j]
	})
	var sb strings.Builder
	for _, n := range names {
		data, err := kernelFS.ReadFile("kernels/" + n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&sb, "#line 1 \"%s\"\n", n)
		sb.Write(data)
		sb.WriteString("\n")
	}
	return sb.String(), nil
}

// kernels is the loaded module; functions are looked up once by name.
type kernels struct {
	mod   C.CUmodule
	funcs map[string]kfunc
}

func (k *kernels) get(name string) kfunc {
	if f, ok := k.funcs[name]; ok {
		return f
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f kfunc
	if err := check("cuModuleGetFunction "+name, C.k_cuModuleGetFunction(&f, k.mod, cname)); err != nil {
		panic(err)
	}
	k.funcs[name] = f
	return f
}

func cacheDir(dir string) string {
	if dir != "" {
		return dir
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "kiln", "kernels")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "kiln", "kernels")
	}
	return filepath.Join(os.TempDir(), "kiln-kernels")
}

// compileKernels returns the kernel module for arch, from the disk cache or
// compiled by NVRTC (and then cached).
func compileKernels(arch, dir string) (*kernels, error) {
	src, err := kernelSource()
	if err != nil {
		return nil, err
	}
	if err := loadNVRTC(); err != nil {
		return nil, fmt.Errorf("cuda: no NVRTC: %w", err)
	}
	var maj, min C.int
	if err := check("nvrtcVersion", C.k_nvrtcVersion(&maj, &min)); err != nil {
		return nil, err
	}
	opts := []string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device", "--use_fast_math", "-lineinfo"}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d.%d\x00%s\x00", arch, maj, min, strings.Join(opts, " "))
	h.Write([]byte(src))
	key := hex.EncodeToString(h.Sum(nil))[:32]
	dir = cacheDir(dir)
	path := filepath.Join(dir, key+".cubin")
	cubin, err := os.ReadFile(path)
	if err != nil {
		cubin, err = nvrtcCompile(src, opts)
		if err != nil {
			return nil, err
		}
		// The cache is an optimisation: failing to write it is not an error.
		if os.MkdirAll(dir, 0o755) == nil {
			tmp := path + fmt.Sprintf(".%d.tmp", os.Getpid())
			if os.WriteFile(tmp, cubin, 0o644) == nil {
				os.Rename(tmp, path)
			}
		}
	}
	k := &kernels{funcs: map[string]kfunc{}}
	if err := check("cuModuleLoadData", C.k_cuModuleLoadData(&k.mod, unsafe.Pointer(&cubin[0]))); err != nil {
		return nil, fmt.Errorf("%w (cached kernels: %s)", err, path)
	}
	return k, nil
}

func nvrtcCompile(src string, opts []string) ([]byte, error) {
	csrc := C.CString(src)
	defer C.free(unsafe.Pointer(csrc))
	cname := C.CString("kiln.cu")
	defer C.free(unsafe.Pointer(cname))
	var prog C.nvrtcProgram
	if r := C.k_nvrtcCreateProgram(&prog, csrc, cname, 0, nil, nil); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtcCreateProgram failed (%d)", r)
	}
	defer C.k_nvrtcDestroyProgram(&prog)
	copts := make([]*C.char, len(opts))
	for i, o := range opts {
		copts[i] = C.CString(o)
		defer C.free(unsafe.Pointer(copts[i]))
	}
	if r := C.k_nvrtcCompileProgram(prog, C.int(len(opts)), &copts[0]); r != 0 {
		var n C.size_t
		C.k_nvrtcGetProgramLogSize(prog, &n)
		log := make([]byte, int(n)+1)
		C.k_nvrtcGetProgramLog(prog, (*C.char)(unsafe.Pointer(&log[0])))
		return nil, fmt.Errorf("cuda: compiling kernels failed (nvrtc %d):\n%s", r, strings.TrimRight(string(log), "\x00"))
	}
	var n C.size_t
	if r := C.k_nvrtcGetCUBINSize(prog, &n); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtcGetCUBINSize failed (%d)", r)
	}
	cubin := make([]byte, int(n))
	if r := C.k_nvrtcGetCUBIN(prog, (*C.char)(unsafe.Pointer(&cubin[0]))); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtcGetCUBIN failed (%d)", r)
	}
	return cubin, nil
}
