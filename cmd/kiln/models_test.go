package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/hubtest"
	"github.com/kiln-llm/kiln/internal/ollamatest"
)

// modelsEnv starts the test hub and returns the environment of a user
// whose hub cache is empty and whose Ollama store holds qwen3:8b (a GGUF
// fixture), with the blob's path and the store's directory.
func modelsEnv(t *testing.T) (env []string, blob, store string) {
	t.Helper()
	h := hubtest.StartModels(t)
	home := t.TempDir()
	store = filepath.Join(home, "ollama")
	var err error
	if blob, err = ollamatest.Add(store, "qwen3:8b", hubtest.Fixture(t, "qwen3-w256-Q8_0.gguf")); err != nil {
		t.Fatal(err)
	}
	runtimeDir, err := os.MkdirTemp("", "kiln")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runtimeDir) })
	env = append(os.Environ(), "HOME="+home, "XDG_RUNTIME_DIR="+runtimeDir, "XDG_CACHE_HOME="+filepath.Join(home, ".cache"), "KILN_API_KEY=", "HF_ENDPOINT="+h.URL(),
		"HF_HUB_CACHE="+filepath.Join(home, "hf"), "OLLAMA_MODELS="+store, "HF_TOKEN=", "HF_HUB_OFFLINE=")
	return env, blob, store
}

// TestModelsCLI is a user's session with models by name: a missing model
// says what to run, kiln pull fetches it, ls/show describe it, run uses
// it, run --pull fetches and runs, rm removes it and refuses Ollama's.
func TestModelsCLI(t *testing.T) {
	bin := kilnBinary(t)
	env, _, _ := modelsEnv(t)
	kiln := func(args ...string) (string, string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	_, errOut, err := kiln("run", "--model", "kiln-test/tiny-qwen3", "--no-daemon", "hi")
	if err == nil || !strings.Contains(errOut, "`kiln pull kiln-test/tiny-qwen3` downloads it") || !strings.Contains(errOut, "--pull") {
		t.Fatalf("run of a model not pulled: %v\n%s", err, errOut)
	}
	out, errOut, err := kiln("pull", "kiln-test/tiny-qwen3")
	if err != nil || !strings.Contains(errOut, "model.safetensors") || !strings.Contains(errOut, "sha256 verified") || !strings.Contains(out, "kiln run --model kiln-test/tiny-qwen3") {
		t.Fatalf("pull: %v\n%s%s", err, out, errOut)
	}
	if _, errOut, err := kiln("pull", "kiln-test/tiny-qwen3"); err != nil || !strings.Contains(errOut, "up to date") {
		t.Errorf("second pull: %v\n%s", err, errOut)
	}
	out, _, err = kiln("ls")
	if err != nil || !regexp.MustCompile(`kiln-test/tiny-qwen3\s+BF16\s+\d+ kB`).MatchString(out) || !regexp.MustCompile(`qwen3:8b\s+GGUF Q8_0`).MatchString(out) {
		t.Errorf("ls: %v\n%s", err, out)
	}
	out, _, err = kiln("show", "kiln-test/tiny-qwen3")
	if err != nil || !strings.Contains(out, "Qwen3ForCausalLM (qwen3)") || !strings.Contains(out, "4096 tokens") || !strings.Contains(out, "model.safetensors") {
		t.Errorf("show: %v\n%s", err, out)
	}
	out, errOut, err = kiln("run", "--model", "kiln-test/tiny-qwen3", "--no-daemon", "--max-tokens", "4", "--temperature", "0", "hi")
	if err != nil || strings.TrimSpace(out) == "" {
		t.Errorf("run: %v\n%q\n%s", err, out, errOut)
	}
	out, errOut, err = kiln("run", "--pull", "--model", "kiln-test/qwen3-w256-GGUF:Q5_K_M", "--no-daemon", "--max-tokens", "4", "--temperature", "0", "hi")
	if err != nil || !strings.Contains(errOut, "pulled kiln-test/qwen3-w256-GGUF:Q5_K_M") || strings.TrimSpace(out) == "" {
		t.Errorf("run --pull: %v\n%q\n%s", err, out, errOut)
	}
	if _, errOut, err := kiln("rm", "qwen3:8b"); err == nil || !strings.Contains(errOut, "`ollama rm qwen3:8b`") {
		t.Errorf("rm of Ollama's model: %v\n%s", err, errOut)
	}
	if out, _, err := kiln("rm", "kiln-test/tiny-qwen3", "kiln-test/qwen3-w256-GGUF:Q5_K_M"); err != nil || strings.Count(out, "removed") != 2 {
		t.Errorf("rm: %v\n%s", err, out)
	}
	if out, _, _ := kiln("ls"); strings.Contains(out, "kiln-test/") || !strings.Contains(out, "qwen3:8b") {
		t.Errorf("ls after rm:\n%s", out)
	}
	// HF_HUB_OFFLINE: no request; a missing model says so.
	env = append(env, "HF_HUB_OFFLINE=1")
	if _, errOut, err := kiln("pull", "kiln-test/demo"); err == nil || !strings.Contains(errOut, "HF_HUB_OFFLINE") {
		t.Errorf("offline pull: %v\n%s", err, errOut)
	}
}

// TestOllamaInPlace serves qwen3:8b from the Ollama store: the process maps
// the store's blob itself (same device and inode; no copy anywhere), the
// store is left as it was, and Ollama's model routes answer from the same
// catalog as kiln ls.
func TestOllamaInPlace(t *testing.T) {
	bin := kilnBinary(t)
	env, blob, store := modelsEnv(t)
	before := treeState(t, store)
	run := exec.Command(bin, "run", "--model", "qwen3:8b", "--no-daemon", "--backend", "cpu", "--max-tokens", "3", "hi")
	run.Env = env
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("kiln run --model qwen3:8b: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve", "--model", "qwen3:8b", "--backend", "cpu", "--addr", "127.0.0.1:0", "--socket", "none")
	cmd.Env = env
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	var addr string
	sc := bufio.NewScanner(stderr)
	for addr == "" && sc.Scan() { // kiln logs "model loaded", then where it listens
		if strings.Contains(sc.Text(), "model loaded") && !strings.Contains(sc.Text(), "model=qwen3:8b") {
			t.Errorf("served as: %s", sc.Text())
		}
		if m := regexp.MustCompile(`network=tcp addr=(\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if addr == "" {
		t.Fatal("kiln serve did not start")
	}
	var st struct {
		Model string            `json:"model"`
		Info  map[string]string `json:"info"`
	}
	getJSON(t, "http://"+addr+"/status", &st)
	if st.Model != "qwen3:8b" || st.Info["model_dir"] != blob {
		t.Errorf("status: %+v, want the blob %s", st, blob)
	}
	var fi syscall.Stat_t
	if err := syscall.Stat(blob, &fi); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc maps to check the mapping: %v", err)
	}
	// A maps line: address perms offset dev(major:minor, hex) inode path.
	dev := uint64(fi.Dev)
	wantDev := fmt.Sprintf("%02x:%02x", dev>>8&0xfff|dev>>32&^uint64(0xfff), dev&0xff|dev>>12&^uint64(0xff))
	mapped := false
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[5] == blob {
			if f[3] != wantDev || f[4] != fmt.Sprint(fi.Ino) {
				t.Errorf("mapped %s is device %s inode %s; the blob is %s inode %d", blob, f[3], f[4], wantDev, fi.Ino)
			}
			mapped = true
		}
	}
	if !mapped {
		t.Errorf("the server does not map the blob %s (inode %d) in place:\n%s", blob, fi.Ino, maps)
	}
	var tags struct {
		Models []struct {
			Name, Digest string
			Size         int64
		} `json:"models"`
	}
	getJSON(t, "http://"+addr+"/api/tags", &tags)
	if len(tags.Models) != 1 || tags.Models[0].Name != "qwen3:8b" || tags.Models[0].Size <= 0 || len(tags.Models[0].Digest) != 64 {
		t.Errorf("tags: %+v", tags)
	}
	if after := treeState(t, store); after != before {
		t.Errorf("Ollama's store changed:\n%s\nthen\n%s", before, after)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

// treeState lists every file under dir with its inode, size and time.
func treeState(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			st := fi.Sys().(*syscall.Stat_t)
			fmt.Fprintf(&b, "%s %d %d %s\n", p, st.Ino, fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		}
		return nil
	})
	return b.String()
}

// --context bounds the engine's context below the model's (the demo
// model's is 2048), and more than the model's is refused; the CPU's KV
// cache, sized from the memory available, holds the model's whole context.
func TestContextFlag(t *testing.T) {
	for _, c := range []struct {
		flag, want int
		limit      engine.ContextLimit
	}{{0, 2048, engine.LimitModel}, {100, 100, engine.LimitOption}} {
		f := modelFlags{backend: "cpu", context: c.flag}
		lm, err := f.load()
		if err != nil {
			t.Fatal(err)
		}
		if ctx, limit := lm.sess.Engine().Context(); ctx != c.want || limit != c.limit {
			t.Errorf("--context %d: context %d (%s), want %d (%s)", c.flag, ctx, limit, c.want, c.limit)
		}
		lm.sess.Close()
	}
	f := modelFlags{backend: "cpu", context: 4096}
	if _, err := f.load(); err == nil || !strings.Contains(err.Error(), "context length of 2048") {
		t.Errorf("--context 4096 over the model's 2048: %v", err)
	}
}
