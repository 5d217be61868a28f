package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/internal/testmodel"
)

// cliEnv returns the environment of a kiln process in a test: its runtime
// directory (sockets, pid files; a short path: Unix socket paths must stay
// under 108 bytes) and cache (the state cache) in a directory of the test,
// and no API key.
func cliEnv(t *testing.T) (env []string, runtimeDir string) {
	runtimeDir, err := os.MkdirTemp("", "kiln")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runtimeDir) })
	return append(os.Environ(), "XDG_RUNTIME_DIR="+runtimeDir, "XDG_CACHE_HOME="+filepath.Join(runtimeDir, "cache"), "KILN_API_KEY="), runtimeDir
}

// TestCLI builds kiln and uses it as people do, on the embedded demo model:
// serve with a SIGTERM drain, start/status/run/stop through the daemon, run
// in-process with piped stdin, chat, and the error paths.
func TestCLI(t *testing.T) {
	bin := kilnBinary(t)
	env, runtimeDir := cliEnv(t)
	kiln := func(stdin string, args ...string) (string, string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	t.Run("help", func(t *testing.T) {
		// Asking for help is no error: every command prints its flags and exits 0.
		names := [][]string{{"bench", "serve"}}
		for name := range commands {
			names = append(names, []string{name})
		}
		for _, name := range names {
			_, errOut, err := kiln("", append(name, "-h")...)
			if err != nil || !strings.Contains(errOut, "-") || strings.Contains(errOut, "help requested") {
				t.Errorf("kiln %s -h: %v\n%s", strings.Join(name, " "), err, errOut)
			}
			for _, line := range strings.Split(errOut, "\n") {
				if strings.Count(line, "(default") > 1 {
					t.Errorf("kiln %s -h states a default twice: %s", strings.Join(name, " "), strings.TrimSpace(line))
				}
			}
		}
	})
	t.Run("serve drains on SIGTERM", func(t *testing.T) { testServeDrain(t, bin, env, runtimeDir) })
	t.Run("daemon", func(t *testing.T) {
		out, errOut, err := kiln("", "start", "--addr", "none")
		if err != nil || !strings.Contains(out, "kiln daemon running") {
			t.Fatalf("start: %v\n%s%s", err, out, errOut)
		}
		defer kiln("", "stop")
		if fi, err := os.Stat(filepath.Join(runtimeDir, "kiln")); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("runtime dir: %v %v", fi.Mode(), err)
		}
		if _, _, err := kiln("", "start", "--addr", "none"); err == nil {
			t.Error("a second start succeeded")
		}
		// kiln run goes through the daemon: its completed count grows.
		out, errOut, err = kiln("func add(a, b int) int {\n", "run", "--max-tokens", "12", "Finish this Go code:")
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("run: %v\n%q\n%s", err, out, errOut)
		}
		out, _, err = kiln("", "status")
		if err != nil || !strings.Contains(out, "running") || !strings.Contains(out, "kiln-demo") || !regexp.MustCompile(`\b1 completed`).MatchString(out) {
			t.Errorf("status: %v\n%s", err, out)
		}
		// A load flag the daemon's model was not loaded with is refused,
		// one it was loaded with is not.
		if _, errOut, err := kiln("", "run", "--kv", "f32", "hi"); err == nil || !strings.Contains(errOut, "--kv f32") || !strings.Contains(errOut, "--no-daemon") {
			t.Errorf("run --kv f32 beside a bf16 daemon: %v\n%s", err, errOut)
		}
		if out, errOut, err := kiln("", "run", "--kv", "bf16", "--backend", "cpu", "--max-tokens", "4", "hi"); err != nil || strings.TrimSpace(out) == "" {
			t.Errorf("run --kv bf16 --backend cpu through the daemon: %v\n%q\n%s", err, out, errOut)
		}
		out, errOut, err = kiln("", "stop")
		if err != nil || !strings.Contains(out, "stopped") {
			t.Errorf("stop: %v %s %s", err, out, errOut)
		}
		if _, errOut, err := kiln("", "status"); err == nil || !strings.Contains(errOut, "no daemon") {
			t.Errorf("status after stop: %v %s", err, errOut)
		}
		for _, f := range []string{"kiln.sock", "kiln.pid"} {
			if _, err := os.Stat(filepath.Join(runtimeDir, "kiln", f)); err == nil {
				t.Errorf("%s left behind", f)
			}
		}
	})
	t.Run("run in-process", func(t *testing.T) {
		out, errOut, err := kiln("package main\n", "run", "--no-daemon", "--max-tokens", "16", "--seed", "1", "Complete:")
		if err != nil || strings.TrimSpace(out) == "" || !strings.HasSuffix(out, "\n") {
			t.Fatalf("run: %v\n%q\n%s", err, out, errOut)
		}
		if errOut != "" {
			t.Errorf("run wrote to stderr: %q", errOut)
		}
		// The same greedy request is answered the same way.
		again, _, _ := kiln("package main\n", "run", "--no-daemon", "--max-tokens", "16", "--temperature", "0", "Complete:")
		again3, _, _ := kiln("package main\n", "run", "Complete:", "--no-daemon", "--max-tokens", "16", "--temperature", "0")
		if again != again3 {
			t.Errorf("flags after the prompt changed the answer: %q vs %q", again, again3)
		}
	})
	t.Run("run errors", func(t *testing.T) {
		if _, errOut, err := kiln("", "run", "--no-daemon"); err == nil || !strings.Contains(errOut, "no prompt") {
			t.Errorf("no prompt: %v %q", err, errOut)
		}
		if _, errOut, err := kiln("", "run", "--model", "/nonexistent/model", "hi"); err == nil || !strings.Contains(errOut, "/nonexistent/model") {
			t.Errorf("missing model: %v %q", err, errOut)
		}
		if _, errOut, err := kiln("", "serve", "--addr", "0.0.0.0:0", "--socket", "none"); err == nil || !strings.Contains(errOut, "--api-key") {
			t.Errorf("public address without a key: %v %q", err, errOut)
		}
		// A flag the flag package refuses is reported once, with the usage.
		for _, bad := range []struct {
			args []string
			msg  string
		}{{[]string{"run", "--bogus", "hi"}, "flag provided but not defined: -bogus"}, {[]string{"bench", "--steps", "abc"}, `invalid value "abc" for flag -steps`}} {
			_, errOut, err := kiln("", bad.args...)
			if err == nil || strings.Count(errOut, bad.msg) != 1 || !strings.Contains(errOut, "-backend string") {
				t.Errorf("kiln %s: %v %q", strings.Join(bad.args, " "), err, errOut)
			}
		}
		// Out-of-range flags are named; none is silently taken (a negative
		// --max-tokens was "unlimited") or answered with the engine's structs.
		for _, bad := range [][]string{
			{"run", "hi", "--max-tokens", "-3"}, {"run", "hi", "--temperature", "5"}, {"chat", "--seed", "-2"},
			{"run", "hi", "--no-daemon", "--kv-memory", "-5"}, {"serve", "--addr", "none", "--max-running", "-1"}, {"serve", "--addr", "none", "--max-batch-tokens", "-1"},
			{"serve", "--addr", "none", "--max-running", "32", "--max-batch-tokens", "16"},
		} {
			flag := bad[len(bad)-2]
			if _, errOut, err := kiln("", bad...); err == nil || !strings.Contains(errOut, flag+" ") || strings.Contains(errOut, "{") {
				t.Errorf("kiln %s: %v %q", strings.Join(bad, " "), err, errOut)
			}
		}
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		if _, errOut, err := kiln("", "serve", "--addr", busy.Addr().String(), "--socket", "none"); err == nil || !strings.Contains(errOut, "is in use") {
			t.Errorf("busy port: %v %q", err, errOut)
		}
	})
	t.Run("stop with a stale pid file", func(t *testing.T) {
		// The daemon died by SIGKILL; its pid now names an unrelated process.
		other := exec.Command("sleep", "30")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		defer other.Process.Kill()
		sock := filepath.Join(runtimeDir, "kiln", "stale.sock")
		if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(runtimeDir, "kiln", "stale.pid"), []byte(strconv.Itoa(other.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, errOut, err := kiln("", "stop", "--socket", sock); err == nil || !strings.Contains(errOut, "no daemon is running") {
			t.Errorf("stop: %v %q", err, errOut)
		}
		if err := other.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("kiln stop signalled an unrelated process: %v", err)
		}
	})
	t.Run("chat with a very long line", func(t *testing.T) {
		in := strings.Repeat("func main() { ", 200_000) + "\nhi\n"
		out, errOut, err := kiln(in, "chat", "--no-daemon", "--max-tokens", "4")
		if err != nil || !strings.Contains(errOut, "no room for an answer in the context of 2048 tokens") || strings.TrimSpace(out) == "" {
			t.Errorf("chat: %v\nstdout %q\nstderr %q", err, out, errOut)
		}
	})
	t.Run("run interrupted", func(t *testing.T) { testRunInterrupted(t, bin, env) })
	t.Run("chat", func(t *testing.T) {
		in := "/system You write Go.\nfunc main() {\n/stats\n/think off\nand then?\n/reset\n/bogus\n/exit\nnever sent\n"
		out, errOut, err := kiln(in, "chat", "--no-daemon", "--max-tokens", "8")
		if err != nil {
			t.Fatalf("chat: %v\n%s\n%s", err, out, errOut)
		}
		for _, want := range []string{"(system prompt set", "tok/s", "(thinking off)", "(conversation cleared)", "unknown command /bogus"} {
			if !strings.Contains(out, want) {
				t.Errorf("chat output lacks %q:\n%s", want, out)
			}
		}
	})
}

// testServeDrain starts "kiln serve", begins a long streamed request on its
// socket, sends SIGTERM, and checks that the request still completes, that
// the process exits 0 and removes its socket.
func testServeDrain(t *testing.T, bin string, env []string, dir string) {
	sock := filepath.Join(dir, "serve.sock")
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--socket", sock, "--drain-timeout", "20s")
	cmd.Env = env
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	logs := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs <- sc.Text()
		}
		close(logs)
	}()
	var tcpAddr string
	deadline := time.After(30 * time.Second)
	for tcpAddr == "" {
		select {
		case l := <-logs:
			if m := regexp.MustCompile(`network=tcp addr=(\S+)`).FindStringSubmatch(l); m != nil {
				tcpAddr = m[1]
			}
		case <-deadline:
			t.Fatal("serve did not start listening")
		}
	}
	// Wait for the socket too.
	for range 100 {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	hc := socketClient(sock)
	body := `{"prompt":"package main","max_tokens":150,"ignore_eos":true,"stream":true,"temperature":0}`
	req, _ := http.NewRequestWithContext(context.Background(), "POST", "http://kiln/v1/completions", strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream broken by the drain: %v", err)
	}
	finish := ""
	for _, line := range strings.Split(string(rest), "\n") {
		var ch streamChunk
		if d, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(d), &ch) == nil {
			for _, c := range ch.Choices {
				if c.FinishReason != nil {
					finish = *c.FinishReason
				}
			}
		}
	}
	if finish != "length" {
		t.Errorf("the drained request finished with %q, want length", finish)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Errorf("stream did not end with [DONE]: ...%s", rest[max(0, len(rest)-200):])
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("socket left behind")
	}
}

// testRunInterrupted sends Ctrl-C to "kiln run" while it loads a model (its
// config.json is a FIFO nobody writes, so loading blocks) and while it
// answers: both times the process must end promptly, non-zero, saying why.
func testRunInterrupted(t *testing.T, bin string, env []string) {
	fixture := testmodel.Dir("qwen3")
	stuck := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(stuck, "config.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	interrupt := func(cmd *exec.Cmd) error {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatal("kiln run ignored Ctrl-C")
			return nil
		}
	}

	cmd := exec.Command(bin, "run", "--no-daemon", "--model", stuck, "hi")
	cmd.Env, cmd.Stdin = env, strings.NewReader("")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := interrupt(cmd); err == nil {
		t.Error("interrupted while loading, kiln run exited 0")
	}

	// Greedy on the fixture runs to --max-tokens: seconds of output.
	cmd = exec.Command(bin, "run", "--no-daemon", "--model", fixture, "--temperature", "0", "--max-tokens", "4000", "hello")
	var errb bytes.Buffer
	cmd.Env, cmd.Stdin, cmd.Stderr = env, strings.NewReader(""), &errb
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdout).ReadByte(); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	go io.Copy(io.Discard, stdout)
	var exit *exec.ExitError
	if err := interrupt(cmd); !errors.As(err, &exit) || exit.ExitCode() != 130 || errb.Len() != 0 {
		t.Errorf("interrupted mid-answer: %v (want exit status 130), stderr %q", err, errb.String())
	}
}
