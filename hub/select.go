package hub

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// textFiles are the files kiln reads beside a checkpoint's *.safetensors.
var textFiles = []string{
	"config.json", "generation_config.json", "model.safetensors.index.json",
	"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
}

// DefaultQuant is the GGUF file a reference to a GGUF repository without a
// quantization takes, as llama.cpp's -hf and Ollama's hf.co/ names do.
const DefaultQuant = "Q4_K_M"

// selectFiles returns the files of a repository (names) that kiln needs
// for ref: a Hugging Face checkpoint's config, weights, tokenizer and
// template, or one GGUF file, which also names the model (gguf).
func selectFiles(ref Ref, names []string) (need []string, gguf string, err error) {
	var weights, ggufs []string
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
		lower := strings.ToLower(n)
		switch {
		case !strings.Contains(n, "/") && strings.HasSuffix(lower, ".safetensors"):
			weights = append(weights, n)
		case strings.HasSuffix(lower, ".gguf") && !strings.Contains(lower, "mmproj"):
			ggufs = append(ggufs, n)
		}
	}
	checkpoint := has["config.json"] && len(weights) > 0
	switch {
	case ref.Quant == "" && checkpoint:
		if !has["tokenizer.json"] {
			return nil, "", fmt.Errorf("%s has no tokenizer.json, which kiln needs", ref.Repo)
		}
		for _, t := range textFiles {
			if has[t] {
				need = append(need, t)
			}
		}
		return append(need, weights...), "", nil
	case len(ggufs) > 0:
		g, err := pickGGUF(ref, ggufs)
		if err != nil {
			return nil, "", err
		}
		return []string{g}, g, nil
	case ref.Quant != "":
		return nil, "", fmt.Errorf("%s has no GGUF files to pick %s from; without :%s kiln takes its safetensors", ref.Repo, ref.Quant, ref.Quant)
	}
	sort.Strings(names)
	if len(names) > 12 {
		names = append(names[:12], "...")
	}
	return nil, "", fmt.Errorf("%s holds neither a checkpoint (config.json and *.safetensors) nor GGUF files, so kiln cannot load it (it has %s)", ref.Repo, strings.Join(names, ", "))
}

// quantLabel finds a quantization name in a GGUF file's path.
var quantLabel = regexp.MustCompile(`(?i)(?:^|[-._/])((?:UD-)?(?:I?Q[0-9](?:_[A-Z0-9]+)*|TQ[0-9]_[0-9]|BF16|F16|FP16|F32|MXFP4(?:_MOE)?))(?:[-.]|$)`)

// QuantOf returns the quantization name a GGUF file's path carries
// ("Qwen3-8B-Q4_K_M.gguf": "Q4_K_M"), or "".
func QuantOf(name string) string {
	m := quantLabel.FindAllStringSubmatch(name, -1)
	if len(m) == 0 {
		return ""
	}
	return strings.ToUpper(m[len(m)-1][1])
}

// splitPart matches the parts of a GGUF file split by llama.cpp's
// gguf-split.
var splitPart = regexp.MustCompile(`-[0-9]{5}-of-[0-9]{5}\.gguf$`)

// pickGGUF chooses the GGUF file of ggufs that ref names: the one whose
// path carries ref.Quant as a whole word (case aside), or with no
// quantization the only file, else Q4_K_M.
func pickGGUF(ref Ref, ggufs []string) (string, error) {
	quant := ref.Quant
	if quant == "" {
		if len(ggufs) == 1 {
			return ggufs[0], nil
		}
		quant = DefaultQuant
	}
	var hits []string
	for _, g := range ggufs {
		if hasWord(strings.ToLower(g), strings.ToLower(quant)) {
			hits = append(hits, g)
		}
	}
	switch {
	case len(hits) == 1:
		if splitPart.MatchString(hits[0]) {
			return "", fmt.Errorf("%s's %s is split into parts (%s); kiln reads single-file GGUF models: pick another quantization, or join the parts with llama.cpp's gguf-split --merge", ref.Repo, quant, hits[0])
		}
		return hits[0], nil
	case len(hits) > 1 && allSplit(hits):
		return "", fmt.Errorf("%s's %s is split into %d parts; kiln reads single-file GGUF models: pick another quantization, or join the parts with llama.cpp's gguf-split --merge", ref.Repo, quant, len(hits))
	case len(hits) > 1:
		return "", fmt.Errorf("%s: %q matches %d GGUF files (%s); name one exactly", ref.Repo, quant, len(hits), strings.Join(hits, ", "))
	}
	var have []string
	for _, g := range ggufs {
		q := QuantOf(g)
		if q == "" {
			q = g
		}
		if !slices.Contains(have, q) {
			have = append(have, q)
		}
	}
	sort.Strings(have)
	if ref.Quant == "" {
		return "", fmt.Errorf("%s holds %d GGUF files and no %s; pick one: %s:%s", ref.Repo, len(ggufs), DefaultQuant, ref.Repo, strings.Join(have, ", "+ref.Repo+":"))
	}
	return "", fmt.Errorf("%s has no GGUF file for %s; it has %s", ref.Repo, quant, strings.Join(have, ", "))
}

func allSplit(names []string) bool {
	for _, n := range names {
		if !splitPart.MatchString(n) {
			return false
		}
	}
	return true
}

// hasWord reports whether word (not empty) occurs in s between separators:
// after the start, '-', '.', '_' or '/', and before the end, '-' or '.'; so
// Q4_K names "x-Q4_K.gguf" but not "x-Q4_K_M.gguf".
func hasWord(s, word string) bool {
	if word == "" {
		return false
	}
	for i := 0; ; {
		j := strings.Index(s[i:], word)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(word)
		if (start == 0 || strings.ContainsRune("-._/", rune(s[start-1]))) && (end == len(s) || strings.ContainsRune("-.", rune(s[end]))) {
			return true
		}
		i = start + 1
	}
}

// missingShards lists the weight files a snapshot's index names that it
// does not hold (an interrupted pull).
func missingShards(snap string) []string {
	b, err := os.ReadFile(filepath.Join(snap, "model.safetensors.index.json"))
	if err != nil {
		return nil
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if json.Unmarshal(b, &idx) != nil {
		return nil
	}
	var missing []string
	for _, f := range idx.WeightMap {
		if _, err := os.Stat(filepath.Join(snap, path.Clean("/" + f)[1:])); err != nil && !slices.Contains(missing, f) {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	return missing
}
