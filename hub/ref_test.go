package hub

import (
	"strings"
	"testing"
)

func TestParseRef(t *testing.T) {
	for in, want := range map[string]Ref{
		"Qwen/Qwen3-8B":                                          {Repo: "Qwen/Qwen3-8B"},
		"Qwen/Qwen3-8B@main":                                     {Repo: "Qwen/Qwen3-8B", Revision: "main"},
		"Qwen/Qwen3-8B-GGUF:Q4_K_M":                              {Repo: "Qwen/Qwen3-8B-GGUF", Quant: "Q4_K_M"},
		"Qwen/Qwen3-8B-GGUF@v1.0:q8_0":                           {Repo: "Qwen/Qwen3-8B-GGUF", Revision: "v1.0", Quant: "q8_0"},
		"hf.co/unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL":                 {Repo: "unsloth/Qwen3-8B-GGUF", Quant: "UD-Q4_K_XL"},
		"https://huggingface.co/Qwen/Qwen3-0.6B":                 {Repo: "Qwen/Qwen3-0.6B"},
		"Qwen/Qwen3-8B@refs/pr/12":                               {Repo: "Qwen/Qwen3-8B", Revision: "refs/pr/12"},
		"org_1/name.v2@0123456789abcdef0123456789abcdef01234567": {Repo: "org_1/name.v2", Revision: "0123456789abcdef0123456789abcdef01234567"},
	} {
		got, err := ParseRef(in)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"qwen3:8b":                        "want ORG/NAME",
		"Qwen":                            "want ORG/NAME",
		"a/b/c":                           "want ORG/NAME",
		"../etc":                          "not a valid repository name",
		"Qwen/..":                         "not a valid repository name",
		"Qwen/a--b":                       "not a valid repository name",
		"Qwen/Qwen3@":                     "empty revision",
		"Qwen/Qwen3@../../x":              "not a branch",
		"Qwen/Qwen3@/abs":                 "not a branch",
		"Qwen/Qwen3:":                     "empty quantization",
		"Qwen/Qwen3:Q4/../x":              "not a quantization",
		"Qwen/Qwen3:Q4@main":              "revision goes before",
		"./models/Qwen3-8B":               "want ORG/NAME",
		"/models/Qwen3-8B":                "want ORG/NAME",
		"Qwen/Qwen3-8B.":                  "not a valid repository name",
		"Qwen-/Qwen3-8B":                  "not a valid repository name",
		"Qwen/" + strings.Repeat("x", 97): "not a valid repository name",
	} {
		if _, err := ParseRef(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRef(%q): %v, want %q", in, err, want)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen3-8B", "Qwen/Qwen3-8B-GGUF@v1:Q4_K_M", "hf.co/a/b:c", "a/b@refs/pr/1", "a/b@..", ":", "@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		// What parses names a path inside the cache and reads back as itself.
		if again, err := ParseRef(r.String()); err != nil || again != r {
			t.Errorf("%q parsed as %+v, which reads back as %+v, %v", s, r, again, err)
		}
		if !validName(FolderName(r.Repo)) || strings.Contains(r.Revision, "..") && checkRevision(r.Revision) == nil {
			t.Errorf("%q gives folder %q, revision %q", s, FolderName(r.Repo), r.Revision)
		}
		if repoOfFolder(FolderName(r.Repo)) != r.Repo {
			t.Errorf("%q: folder %q reads back as %q", s, FolderName(r.Repo), repoOfFolder(FolderName(r.Repo)))
		}
	})
}

func TestQuantOf(t *testing.T) {
	for name, want := range map[string]string{
		"Qwen3-8B-Q4_K_M.gguf":                   "Q4_K_M",
		"qwen3-8b-q8_0.gguf":                     "Q8_0",
		"Qwen3-30B-A3B-UD-Q4_K_XL.gguf":          "UD-Q4_K_XL",
		"Qwen3-8B-BF16.gguf":                     "BF16",
		"Q8_0/Qwen3-8B-Q8_0-00001-of-00002.gguf": "Q8_0",
		"gpt-oss-20b-MXFP4.gguf":                 "MXFP4",
		"Qwen3-8B-IQ4_XS.gguf":                   "IQ4_XS",
		"model.gguf":                             "",
	} {
		if got := QuantOf(name); got != want {
			t.Errorf("QuantOf(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestSelectFiles(t *testing.T) {
	ckpt := []string{"config.json", "tokenizer.json", "model.safetensors", "README.md", "LICENSE", ".gitattributes",
		"chat_template.jinja", "original/model.safetensors", "pytorch_model.bin", "merges.txt", "vocab.json"}
	need, gguf, err := selectFiles(Ref{Repo: "a/b"}, ckpt)
	if err != nil || gguf != "" || strings.Join(need, ",") != "config.json,tokenizer.json,chat_template.jinja,model.safetensors" {
		t.Errorf("checkpoint: %q %q %v", need, gguf, err)
	}
	ggufs := []string{"README.md", "x-Q4_K_M.gguf", "x-Q4_K_S.gguf", "x-Q5_K_M.gguf", "sub/x-Q8_0.gguf", "mmproj-x-F16.gguf"}
	for quant, want := range map[string]string{"": "x-Q4_K_M.gguf", "Q4_K_S": "x-Q4_K_S.gguf", "q8_0": "sub/x-Q8_0.gguf"} {
		if need, gguf, err := selectFiles(Ref{Repo: "a/b", Quant: quant}, ggufs); err != nil || gguf != want || len(need) != 1 {
			t.Errorf(":%s: %q %q %v", quant, need, gguf, err)
		}
	}
	_, _, err = selectFiles(Ref{Repo: "a/b"}, []string{"x-Q8_0.gguf", "x-Q6_K.gguf"})
	if err == nil || !strings.Contains(err.Error(), "pick one: a/b:Q6_K, a/b:Q8_0") {
		t.Errorf("no default: %v", err)
	}
	if _, gguf, err := selectFiles(Ref{Repo: "a/b"}, []string{"only.gguf", "mmproj.gguf"}); err != nil || gguf != "only.gguf" {
		t.Errorf("one file: %q %v", gguf, err)
	}
	if _, _, err := selectFiles(Ref{Repo: "a/b"}, []string{"config.json", "model.safetensors"}); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("no tokenizer: %v", err)
	}
}

func FuzzHasWord(f *testing.F) {
	f.Add("x-q4_k_m.gguf", "q4_k")
	f.Add("aaaa", "aa")
	f.Fuzz(func(t *testing.T, s, word string) {
		if hasWord(s, word) && !strings.Contains(s, word) {
			t.Errorf("hasWord(%q, %q) without the word in it", s, word)
		}
	})
}
