//go:build cgo

package cuda

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestKernelSignatures needs no GPU: it runs the kernel sources through the
// C preprocessor (the macros that stamp out kernel families expanded), and
// checks that every kernel the package declares (newKernel) is there, with
// the parameters its argument struct lists, in order, of the same names and
// C types (a pointer a devptr, int an int32, long an int64, float a
// float32, a struct by value a struct of the same fields); that every
// kernel of the sources is declared; and that sampleArgs is struct
// SampleArgs.
func TestKernelSignatures(t *testing.T) {
	kernels := map[string]cKernel{}
	var sampleStruct string
	for file, src := range preprocessedKernels(t) {
		if err := parseKernels(file, src, kernels); err != nil {
			t.Fatal(err)
		}
		if s, ok := parseStructs(src)["SampleArgs"]; ok {
			var err error
			if sampleStruct, err = cStruct("SampleArgs", s); err != nil {
				t.Fatal(err)
			}
		}
	}
	declared := map[string]bool{}
	for _, d := range kernelDefs {
		if declared[d.name] {
			t.Errorf("kernel %s is declared twice", d.name)
		}
		declared[d.name] = true
		k, ok := kernels[d.name]
		if !ok {
			t.Errorf("kernel %s (%v) is not in kernels/*.cu", d.name, d.args)
			continue
		}
		want, err := cParams(k.params, k.structs)
		if err != nil {
			t.Errorf("kernel %s (%s): %v", d.name, k.file, err)
			continue
		}
		var got []string
		for _, f := range kernelParams(d.args) {
			got = append(got, f.Name+" "+goKernelType(f.Type))
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Errorf("kernel %s: parameter %d is %s in %s, %s in %v\n\tsource: (%s)\n\tGo:     (%s)",
				d.name, i+1, at(want, i), k.file, at(got, i), d.args, strings.Join(want, ", "), strings.Join(got, ", "))
		}
	}
	var undeclared []string
	for name := range kernels {
		if !declared[name] {
			undeclared = append(undeclared, name)
		}
	}
	sort.Strings(undeclared)
	if len(undeclared) > 0 {
		t.Errorf("kernels without a launcher (newKernel): %s", strings.Join(undeclared, " "))
	}
	if got, want := goKernelType(reflect.TypeFor[sampleArgs]()), sampleStruct; got != want {
		t.Errorf("sampleArgs is %s, struct SampleArgs %s", got, want)
	}
	t.Logf("%d kernels checked", len(kernelDefs))
}

// preprocessedKernels returns the translation units NVRTC compiles, by
// file, each through the C preprocessor. The sources include no CUDA
// header, so a host compiler's preprocessor takes them.
func preprocessedKernels(t *testing.T) map[string]string {
	t.Helper()
	cc := strings.Fields(os.Getenv("CC"))
	if len(cc) == 0 {
		for _, c := range []string{"gcc", "cc", "clang"} {
			if _, err := exec.LookPath(c); err == nil {
				cc = []string{c}
				break
			}
		}
	}
	if len(cc) == 0 {
		t.Skip("no C compiler for its preprocessor (set CC)")
	}
	srcs, err := kernelSources()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for n, src := range srcs {
		cmd := exec.Command(cc[0], append(cc[1:], "-E", "-P", "-x", "c++", "-")...)
		cmd.Stdin = strings.NewReader(src)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("preprocessing %s: %v\n%s", n, err, stderr.String())
		}
		out[n] = stdout.String()
	}
	return out
}

// cKernel is a kernel of the sources: its file, its parameters as written
// and the structs of its translation unit.
type cKernel struct {
	file    string
	params  []string
	structs map[string]string
}

var (
	globalRE = regexp.MustCompile(`\b__global__\b`)
	kernelRE = regexp.MustCompile(`extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?(\w+)\s*\(`)
	structRE = regexp.MustCompile(`\bstruct\s+(\w+)\s*\{([^{}]*)\}\s*;`)
	arrayRE  = regexp.MustCompile(`^(\w+)\s*\[\s*(\d+)\s*\]$`)
)

// parseKernels adds the extern "C" __global__ functions of file, its
// preprocessed source src, to out.
func parseKernels(file, src string, out map[string]cKernel) error {
	ms := kernelRE.FindAllStringSubmatchIndex(src, -1)
	if n := len(globalRE.FindAllStringIndex(src, -1)); n != len(ms) {
		return fmt.Errorf("%s: %d __global__ functions, %d of them `extern \"C\" __global__ void name(...)`: the others cannot be launched by name", file, n, len(ms))
	}
	structs := parseStructs(src)
	for _, m := range ms {
		name := src[m[2]:m[3]]
		open := m[1] - 1
		depth, end := 0, -1
		for i := open; i < len(src) && end < 0; i++ {
			switch src[i] {
			case '(':
				depth++
			case ')':
				if depth--; depth == 0 {
					end = i
				}
			}
		}
		if end < 0 {
			return fmt.Errorf("%s: kernel %s: unterminated parameter list", file, name)
		}
		if k, dup := out[name]; dup {
			return fmt.Errorf("kernel %s is defined in %s and %s", name, k.file, file)
		}
		var params []string
		if list := strings.TrimSpace(src[open+1 : end]); list != "" && list != "void" {
			params = strings.Split(list, ",")
		}
		out[name] = cKernel{file, params, structs}
	}
	return nil
}

// parseStructs returns the bodies of the plain structs (no member
// functions) of preprocessed source, by name.
func parseStructs(src string) map[string]string {
	out := map[string]string{}
	for _, m := range structRE.FindAllStringSubmatch(src, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// cStruct returns struct name, of the given body, in goKernelType's
// notation.
func cStruct(name, body string) (string, error) {
	var fields []string
	for _, decl := range strings.Split(body, ";") {
		decl = strings.TrimSpace(decl)
		if decl == "" {
			continue
		}
		// "float a, b[4]" or "float *p": the type, then declarators.
		decl = strings.TrimPrefix(decl, "const ")
		sp := strings.IndexAny(decl, " \t*")
		if sp < 0 {
			return "", fmt.Errorf("struct %s: field %q", name, decl)
		}
		for _, d := range strings.Split(decl[sp:], ",") {
			d = strings.TrimSpace(d)
			if p, ok := strings.CutPrefix(d, "*"); ok {
				fields = append(fields, strings.TrimSpace(p)+" ptr")
				continue
			}
			typ, err := cScalar(decl[:sp])
			if err != nil {
				return "", fmt.Errorf("struct %s: %v", name, err)
			}
			if a := arrayRE.FindStringSubmatch(d); a != nil {
				fields = append(fields, a[1]+" "+typ+"["+a[2]+"]")
			} else {
				fields = append(fields, d+" "+typ)
			}
		}
	}
	return "struct{" + strings.Join(fields, "; ") + "}", nil
}

// cParams returns kernel parameters as "name type" in goKernelType's
// notation: ptr, int, long, float, or a struct by value.
func cParams(params []string, structs map[string]string) ([]string, error) {
	var out []string
	for _, p := range params {
		p = strings.TrimSpace(strings.ReplaceAll(p, "__restrict__", ""))
		sep := strings.LastIndexAny(p, " \t*&")
		if sep < 0 {
			return nil, fmt.Errorf("parameter %q has no name", p)
		}
		name, typ := p[sep+1:], strings.TrimSpace(p[:sep+1])
		if strings.HasSuffix(typ, "&") {
			return nil, fmt.Errorf("parameter %q: a kernel takes no references", p)
		}
		if strings.HasSuffix(typ, "*") {
			out = append(out, name+" ptr")
			continue
		}
		typ = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(typ, "const "), "struct "))
		if body, ok := structs[typ]; ok {
			s, err := cStruct(typ, body)
			if err != nil {
				return nil, err
			}
			out = append(out, name+" "+s)
			continue
		}
		t, err := cScalar(typ)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %v", p, err)
		}
		out = append(out, name+" "+t)
	}
	return out, nil
}

// cScalar names a C scalar type as goKernelType does its Go counterpart.
func cScalar(typ string) (string, error) {
	switch strings.Join(strings.Fields(typ), " ") {
	case "int":
		return "int", nil
	case "long", "long long":
		return "long", nil
	case "float":
		return "float", nil
	}
	return "", fmt.Errorf("C type %q has no kernel argument type (kernelArg)", typ)
}

// goKernelType names the C type that Go kernel argument type t passes.
func goKernelType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[devptr]():
		return "ptr"
	case reflect.TypeFor[int32]():
		return "int"
	case reflect.TypeFor[int64]():
		return "long"
	case reflect.TypeFor[float32]():
		return "float"
	}
	switch t.Kind() {
	case reflect.Array:
		return goKernelType(t.Elem()) + "[" + strconv.Itoa(t.Len()) + "]"
	case reflect.Struct:
		var fields []string
		for i := range t.NumField() {
			f := t.Field(i)
			fields = append(fields, f.Name+" "+goKernelType(f.Type))
		}
		return "struct{" + strings.Join(fields, "; ") + "}"
	}
	return t.String() + "?"
}

// firstDiff is the first index where a and b differ, or -1.
func firstDiff(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if at(a, i) != at(b, i) {
			return i
		}
	}
	return -1
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "nothing"
}

// TestNVRTCCompile compiles every kernel file with NVRTC as the backend
// does at run time, for each target KILN_NVRTC_CHECK lists (e.g.
// "sm_80,sm_86,sm_89,sm_90a"), without a GPU: an NVRTC of 12.4 or later
// compiles for real the wgmma and FP8 paths that an older local nvcc
// compiles to traps (scripts/check-kernels.sh). Minutes on two cores, so
// only when asked; it skips where no NVRTC loads (Debian's libnvrtc12 is
// in trixie: extract it and set LD_LIBRARY_PATH). With KILN_NVRTC_OUT=DIR
// it writes each cubin there (ARCH-FILE.cubin), for cuobjdump -sass -fun
// KERNEL (in trixie's nvidia-cuda-toolkit) to show the instructions a
// kernel issues.
func TestNVRTCCompile(t *testing.T) {
	archs := os.Getenv("KILN_NVRTC_CHECK")
	if archs == "" {
		t.Skip("set KILN_NVRTC_CHECK=sm_80,sm_90a,... to compile the kernels with NVRTC")
	}
	srcs, err := kernelSources()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, arch := range strings.Split(archs, ",") {
		opts, maj, min, err := nvrtcOptions(arch)
		if err != nil {
			t.Skip(err)
		}
		t.Logf("NVRTC %d.%d, %s", maj, min, arch)
		for _, n := range names {
			t.Run(arch+"/"+n, func(t *testing.T) {
				t.Parallel()
				cubin, err := nvrtcCompile(n, srcs[n], opts)
				if err != nil {
					t.Fatal(err)
				}
				if dir := os.Getenv("KILN_NVRTC_OUT"); dir != "" {
					if err := os.WriteFile(filepath.Join(dir, arch+"-"+strings.TrimSuffix(n, ".cu")+".cubin"), cubin, 0o644); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}

// TestKernelDir: with KILN_CUDA_KERNELS, the sources are the directory's
// .cu and .cuh files (other files left out), each unit as the built-in
// ones are put together.
func TestKernelDir(t *testing.T) {
	builtin, err := kernelSources()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ents, err := kernelFS.ReadDir("kernels")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := kernelFS.ReadFile("kernels/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "sample.cu" {
			data = append(data, "// variant\n"...)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "README.txt"), []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_CUDA_KERNELS", dir)
	got, err := kernelSources()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(builtin) {
		t.Fatalf("%d units from the directory, %d built in", len(got), len(builtin))
	}
	for n, src := range builtin {
		want := src
		if n == "sample.cu" {
			want = strings.TrimSuffix(src, "\n") + "// variant\n\n"
		}
		if got[n] != want {
			t.Errorf("%s: the directory's unit differs from the built-in one", n)
		}
	}
}
