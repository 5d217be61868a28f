package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/internal/testmodel"
)

// TestStateCacheRestart: the next turn of a long conversation, after kiln
// stop and kiln start, is served from the state cache's directory (the
// hybrid fixture: its DeltaNet state and attention KV), and answers as a
// daemon with an empty cache does. The time to first token of the three
// (before the restart, after it, cold) goes to the test log. On a GPU:
//
//	KILN_BINARY=kiln KILN_RESTART_MODEL=q.gguf KILN_RESTART_BACKEND=cuda KILN_RESTART_HISTORY=20000 \
//	  go test -run TestStateCacheRestart -v ./cmd/kiln
//
// (the history in words of the first message).
func TestStateCacheRestart(t *testing.T) {
	bin := kilnBinary(t)
	modelDir, backendName, words := testmodel.Dir("qwen3next"), "cpu", 780
	if m := os.Getenv("KILN_RESTART_MODEL"); m != "" {
		modelDir, backendName = m, "auto"
	}
	if b := os.Getenv("KILN_RESTART_BACKEND"); b != "" {
		backendName = b
	}
	if h := os.Getenv("KILN_RESTART_HISTORY"); h != "" {
		if _, err := fmt.Sscan(h, &words); err != nil {
			t.Fatalf("KILN_RESTART_HISTORY: %v", err)
		}
	}
	env, runtimeDir := cliEnv(t)
	sock := filepath.Join(runtimeDir, "k.sock")
	kiln := func(args ...string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kiln %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	start := func(cache string) {
		kiln("start", "--model", modelDir, "--backend", backendName, "--addr", "none", "--socket", sock,
			"--state-cache", cache, "--state-cache-size", "4GB")
	}
	cl := &benchClient{cfg: &benchConfig{baseURL: "http://kiln"}, http: socketClient(sock)}
	turn := func(msgs []map[string]string) (requestResult, string) {
		t.Helper()
		r, text := cl.stream(context.Background(), "/v1/chat/completions", map[string]any{
			"messages": msgs, "max_tokens": 8, "temperature": 0, "ignore_eos": true})
		if !r.ok {
			t.Fatalf("turn: %s", r.err)
		}
		return r, text
	}
	var history strings.Builder
	sea := strings.Fields("The tide rises and falls twice a day along the long grey shore.")
	for i := range words {
		history.WriteString(sea[i%len(sea)] + " ")
	}
	msgs := []map[string]string{{"role": "system", "content": "You are a patient assistant."}, {"role": "user", "content": history.String()}}

	cache := filepath.Join(runtimeDir, "state")
	start(cache)
	first, answer := turn(msgs)
	msgs = append(msgs, map[string]string{"role": "assistant", "content": answer}, map[string]string{"role": "user", "content": "And then?"})
	warm, answer := turn(msgs)
	kiln("stop", "--socket", sock)
	entries, bytes := 0, int64(0)
	filepath.WalkDir(cache, func(path string, d os.DirEntry, err error) error {
		if fi, ferr := os.Stat(path); err == nil && ferr == nil && fi.Mode().IsRegular() && !strings.HasPrefix(d.Name(), ".") {
			entries, bytes = entries+1, bytes+fi.Size()
		}
		return nil
	})
	t.Logf("the state cache after the first daemon: %d entries, %.1f MB", entries, float64(bytes)/1e6)
	msgs = append(msgs, map[string]string{"role": "assistant", "content": answer}, map[string]string{"role": "user", "content": "Tell me more."})

	start(cache)
	restarted, got := turn(msgs)
	// A client that sends the first answer back re-rendered (as a restarted
	// server's tokenizer may split a random model's answer otherwise)
	// diverges inside it: the conversation resumes at that message's
	// start, which the state cache holds too.
	edited := slices.Clone(msgs)
	edited[2] = map[string]string{"role": "assistant", "content": msgs[2]["content"] + " Indeed."}
	resumed, _ := turn(edited)
	kiln("stop", "--socket", sock)
	start(filepath.Join(runtimeDir, "empty"))
	cold, want := turn(msgs)
	kiln("stop", "--socket", sock)

	if got != want {
		// On the CPU the restored state is bit for bit what recomputing
		// gives; on a GPU, bf16 prefill in other chunks may round apart.
		if backendName == "cpu" {
			t.Errorf("after a restart %q, cold %q", got, want)
		} else {
			t.Logf("after a restart %q, cold %q", got, want)
		}
	}
	// All but the new message and the generation prompt, less a block.
	// The first answer's message start: its generation prompt's header
	// (under a block) before the first turn's prompt end.
	if restarted.cachedTokens < restarted.promptTokens-40 || cold.cachedTokens != 0 || resumed.cachedTokens < first.promptTokens-16 {
		t.Errorf("after a restart %d of %d prompt tokens cached, %d of %d with the first answer re-rendered (its turn's prompt: %d); cold %d",
			restarted.cachedTokens, restarted.promptTokens, resumed.cachedTokens, resumed.promptTokens, first.promptTokens, cold.cachedTokens)
		// The daemons' logs say why.
		if log, err := os.ReadFile(filesFor(sock).log); err == nil {
			t.Logf("the daemons' log:\n%s", log)
		}
	}
	if log, err := os.ReadFile(filesFor(sock).log); err == nil {
		for line := range strings.Lines(string(log)) {
			if strings.Contains(line, "state cache: restored") {
				t.Log(strings.TrimSpace(line)) // where the restored turn's time went
			}
		}
	}
	ms := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	t.Logf("%d-token conversation: first turn TTFT %s (cold), next turn %s (%d cached); after kiln stop/start %s (%d cached), cold %s",
		restarted.promptTokens, ms(first.ttft), ms(warm.ttft), warm.cachedTokens, ms(restarted.ttft), restarted.cachedTokens, ms(cold.ttft))
}

func TestStateCacheFlags(t *testing.T) {
	for in, want := range map[string]int64{"20GB": 20 << 30, "512MB": 512 << 20, "1.5G": 3 << 29, "4096": 4096, "1 KiB": 1024, "0": 0} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GB", "-1GB", "20 parsecs", "1e30TB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	sc, err := (&stateCacheFlags{ram: "1GB"}).resolve()
	if err != nil || sc.Dir != filepath.Join(cache, "kiln", "state") || sc.DiskBytes <= 0 || sc.DiskBytes > 20<<30 || sc.RAMBytes != 1<<30 {
		t.Errorf("default state cache %+v, %v", sc, err)
	}
	if fi, err := os.Stat(sc.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the state cache directory: %v, %v", fi, err)
	}
	if sc, err := (&stateCacheFlags{dir: "none", ram: "0"}).resolve(); err != nil || sc.Dir != "" || sc.RAMBytes != 0 {
		t.Errorf("--state-cache none: %+v, %v", sc, err)
	}
	// A default directory that cannot be made leaves the cache in memory; a
	// named one is an error.
	os.WriteFile(filepath.Join(cache, "file"), nil, 0o600)
	t.Setenv("XDG_CACHE_HOME", filepath.Join(cache, "file"))
	if sc, err := (&stateCacheFlags{ram: "1GB"}).resolve(); err != nil || sc.Dir != "" || sc.RAMBytes != 1<<30 {
		t.Errorf("unusable default directory: %+v, %v", sc, err)
	}
	if _, err := (&stateCacheFlags{dir: filepath.Join(cache, "file", "x"), ram: "1GB"}).resolve(); err == nil {
		t.Error("an unusable --state-cache accepted")
	}
	if _, err := (&stateCacheFlags{dir: "none", size: "1GB", ram: "1GB"}).resolve(); err == nil {
		t.Error("--state-cache-size without a directory accepted")
	}
}
