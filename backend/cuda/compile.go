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
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// definesHeader is the header generated from kernelDefines.
const definesHeader = "defines.cuh"

// kernelDir returns where the kernel sources are read: the built-in ones,
// or with KILN_CUDA_KERNELS set, the .cu and .cuh files of that directory,
// so that a kernel variant runs on a GPU machine without Go (the host code
// must still match its kernels' signatures).
func kernelDir() (fs.FS, string) {
	if d := os.Getenv("KILN_CUDA_KERNELS"); d != "" {
		slog.Warn("cuda: kernel sources from KILN_CUDA_KERNELS, not the built-in ones", "dir", d)
		return os.DirFS(d), "."
	}
	return kernelFS, "kernels"
}

// kernelSources returns one translation unit per kernel file, each with the
// headers in front: definesHeader, then the others by name. Separate units
// compile in parallel.
func kernelSources() (map[string]string, error) {
	fsys, dir := kernelDir()
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	headers := []string{definesHeader}
	var files []string
	for _, e := range ents {
		switch n := e.Name(); {
		case n == definesHeader:
		case strings.HasSuffix(n, ".cuh"):
			headers = append(headers, n)
		case strings.HasSuffix(n, ".cu"):
			files = append(files, n)
		}
	}
	var header strings.Builder
	for _, h := range headers {
		data, err := fs.ReadFile(fsys, path.Join(dir, h))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&header, "#line 1 \"%s\"\n%s\n", h, data)
	}
	out := map[string]string{}
	for _, n := range files {
		data, err := fs.ReadFile(fsys, path.Join(dir, n))
		if err != nil {
			return nil, err
		}
		out[n] = fmt.Sprintf("%s#line 1 \"%s\"\n%s\n", header.String(), n, data)
	}
	return out, nil
}

// kernels are the loaded modules; functions are looked up once by name.
type kernels struct {
	ctx   C.CUcontext
	mods  []C.CUmodule
	funcs map[string]kfunc
	nvrtc int // the compiler's version, nvrtcVersion's form
}

// nvrtcVersion numbers a CUDA compiler version as the kernels'
// KILN_NVRTC_VERSION does: 1204 for 12.4.
func nvrtcVersion(major, minor int) int { return 100*major + minor }

func (k *kernels) get(name string) kfunc {
	if f, ok := k.funcs[name]; ok {
		return f
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	for _, m := range k.mods {
		var f kfunc
		if C.k_cuModuleGetFunction(k.ctx, &f, m, cname) == 0 {
			k.funcs[name] = f
			return f
		}
	}
	panic(fmt.Sprintf("cuda: no kernel %q", name))
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

// nvrtcOptions loads NVRTC and returns the options the kernels compile
// with for arch, and NVRTC's version.
func nvrtcOptions(arch string) (opts []string, maj, min C.int, err error) {
	if err := loadNVRTC(); err != nil {
		return nil, 0, 0, fmt.Errorf("cuda: no NVRTC: %w", err)
	}
	if err := check("nvrtcVersion", C.k_nvrtcVersion(&maj, &min)); err != nil {
		return nil, 0, 0, err
	}
	opts = []string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device", "--use_fast_math", "-lineinfo",
		fmt.Sprintf("-DKILN_NVRTC_VERSION=%d", nvrtcVersion(int(maj), int(min)))}
	// Extra options, for A/B experiments with -D switches in the kernels.
	return append(opts, strings.Fields(os.Getenv("KILN_CUDA_NVRTC_FLAGS"))...), maj, min, nil
}

// compileKernels returns the kernel modules for arch, from the disk cache or
// compiled by NVRTC (each file in parallel, then cached).
func compileKernels(ctx C.CUcontext, arch, dir string) (*kernels, error) {
	srcs, err := kernelSources()
	if err != nil {
		return nil, err
	}
	opts, maj, min, err := nvrtcOptions(arch)
	if err != nil {
		return nil, err
	}
	dir = cacheDir(dir)
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	sort.Strings(names)
	cubins := make([][]byte, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	var compiling []string
	start := time.Now()
	for i, n := range names {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00%d.%d\x00%s\x00", arch, maj, min, strings.Join(opts, " "))
		h.Write([]byte(srcs[n]))
		path := filepath.Join(dir, strings.TrimSuffix(n, ".cu")+"-"+hex.EncodeToString(h.Sum(nil))[:24]+".cubin")
		if data, err := os.ReadFile(path); err == nil {
			cubins[i] = data
			continue
		}
		if len(compiling) == 0 {
			// Tens of seconds on a first run: say so rather than look stuck.
			slog.Info("compiling CUDA kernels with NVRTC (once per GPU, driver and kiln version)", "arch", arch, "cache", dir)
		}
		compiling = append(compiling, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cubins[i], errs[i] = nvrtcCompile(n, srcs[n], opts)
			if errs[i] != nil {
				return
			}
			// The cache is an optimisation: failing to write it is not an error.
			if os.MkdirAll(dir, 0o755) == nil {
				tmp := path + fmt.Sprintf(".%d.tmp", os.Getpid())
				if os.WriteFile(tmp, cubins[i], 0o644) == nil {
					os.Rename(tmp, path)
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(compiling) > 0 {
		slog.Info("compiled CUDA kernels", "files", strings.Join(compiling, " "), "seconds", fmt.Sprintf("%.1f", time.Since(start).Seconds()))
	}
	k := &kernels{ctx: ctx, funcs: map[string]kfunc{}, nvrtc: nvrtcVersion(int(maj), int(min))}
	for i, cubin := range cubins {
		var m C.CUmodule
		if err := check("cuModuleLoadData "+names[i], C.k_cuModuleLoadData(k.ctx, &m, unsafe.Pointer(&cubin[0]))); err != nil {
			return nil, err
		}
		k.mods = append(k.mods, m)
	}
	return k, nil
}

func nvrtcCompile(file, src string, opts []string) ([]byte, error) {
	csrc := C.CString(src)
	defer C.free(unsafe.Pointer(csrc))
	cname := C.CString(file)
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
		return nil, fmt.Errorf("cuda: compiling %s failed (nvrtc %d):\n%s", file, r, strings.TrimRight(string(log), "\x00"))
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
