package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-llm/kiln/catalog"
)

func init() {
	register(&command{name: "ls", summary: "list the models of the Hugging Face cache and of Ollama's store", run: lsCmd})
	register(&command{name: "show", summary: "say what a model is: architecture, parameters, context, quantization, template, files", run: showCmd})
	register(&command{name: "rm", summary: "remove models from the Hugging Face cache (never from Ollama's store)", run: rmCmd})
}

// formatOf is a model's weights as ls shows them: BF16, FP8, GGUF Q4_K_M.
func formatOf(m *catalog.Model) string {
	switch {
	case m.Format == "gguf" && m.Quant != "":
		return "GGUF " + m.Quant
	case m.Format == "gguf":
		return "GGUF"
	case m.Quant != "":
		return m.Quant
	}
	return "?"
}

// tildePath shortens a path under the home directory to ~/...
func tildePath(p string) string {
	if home, err := os.UserHomeDir(); err == nil && home != "/" && strings.HasPrefix(p, home+"/") {
		return "~" + p[len(home):]
	}
	return p
}

func lsCmd(args []string) error {
	fs := flag.NewFlagSet("kiln ls", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON, one object per model")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln ls [--json]\n\nLists the models kiln can load by name: those of the Hugging Face cache ($HF_HUB_CACHE)\nand the GGUF models of Ollama's store ($OLLAMA_MODELS), which kiln uses in place.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cat := newCatalog()
	models, errs := cat.List()
	for _, err := range errs {
		fmt.Fprintf(os.Stderr, "kiln ls: skipped: %v\n", err)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, m := range models {
			if err := enc.Encode(lsEntry(m)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(models) == 0 {
		fmt.Printf("no models in %s or %s\n`kiln pull Qwen/Qwen3-0.6B` downloads one; kiln also runs a directory or .gguf file given by its path\n",
			tildePath(cat.Hub.Cache.Dir), tildePath(cat.Ollama.Dir))
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFORMAT\tSIZE\tMODIFIED\tFROM")
	for _, m := range models {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, formatOf(m), humanBytes(m.Size), m.Modified.Format("2006-01-02 15:04"), tildePath(m.Where))
	}
	return tw.Flush()
}

// lsEntry is a model as kiln ls --json prints it.
func lsEntry(m *catalog.Model) map[string]any {
	return map[string]any{"name": m.Name, "source": m.Source, "path": m.Path, "where": m.Where, "format": m.Format,
		"quantization": m.Quant, "size": m.Size, "digest": m.Digest, "modified": m.Modified.UTC().Format(time.RFC3339)}
}

func showCmd(args []string) error {
	fs := flag.NewFlagSet("kiln show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	template := fs.Bool("template", false, "print only the chat template")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln show [--json|--template] MODEL\n\nMODEL is a path, a Hugging Face id of the cache or an Ollama name (see kiln ls).\n\n")
		fs.PrintDefaults()
	}
	pos, err := modelArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("name one model, not %d", len(pos))
	}
	m, err := newCatalog().Resolve(pos[0])
	if err != nil {
		return err
	}
	in, err := catalog.Describe(m)
	if err != nil {
		return err
	}
	switch {
	case *template:
		if in.Template == "" {
			return fmt.Errorf("%s has no chat template", m.Name)
		}
		_, err := io.WriteString(os.Stdout, in.Template)
		return err
	case *asJSON:
		e := lsEntry(m)
		for k, v := range map[string]any{"architecture": in.Arch, "family": in.Family, "parameters": in.Params, "context_length": in.Context,
			"layers": in.Layers, "hidden_size": in.Hidden, "heads": in.Heads, "kv_heads": in.KVHeads, "experts": in.Experts,
			"experts_used": in.ExpertsUsed, "vocab_size": in.Vocab, "template_from": in.TemplateFrom, "files": in.Files} {
			e[k] = v
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(e)
	}
	writeInfo(os.Stdout, in)
	return nil
}

// writeInfo prints what kiln show says.
func writeInfo(w io.Writer, in *catalog.Info) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{k}, args...)...)
	}
	fmt.Fprintln(tw, in.Name)
	row("from", "%s (%s)", tildePath(in.Where), map[catalog.Source]string{catalog.FromHub: "Hugging Face cache", catalog.FromOllama: "Ollama's store, used in place", catalog.FromPath: "path"}[in.Source])
	row("loads", "%s", tildePath(in.Path))
	row("architecture", "%s (%s)", in.Arch, in.Family)
	row("parameters", "%s (%s)", catalog.ParamSize(in.Params), thousands(in.Params))
	shape := fmt.Sprintf("%d layers, hidden %d, %d heads / %d KV heads", in.Layers, in.Hidden, in.Heads, in.KVHeads)
	if in.Experts > 0 {
		shape += fmt.Sprintf(", %d experts (%d active)", in.Experts, in.ExpertsUsed)
	}
	row("shape", "%s", shape)
	row("context", "%d tokens", in.Context)
	row("vocabulary", "%d tokens", in.Vocab)
	row("weights", "%s (%s)", formatOf(in.Model), in.Format)
	if in.Template == "" {
		row("template", "none")
	} else {
		var can []string
		if strings.Contains(in.Template, "tools") {
			can = append(can, "tool calls")
		}
		if strings.Contains(in.Template, "<think>") || strings.Contains(in.Template, "enable_thinking") {
			can = append(can, "thinking")
		}
		row("template", "%s (%s; %s)", in.TemplateFrom, humanBytes(int64(len(in.Template))), strings.Join(append([]string{"chat"}, can...), ", "))
	}
	if in.Digest != "" {
		row("digest", "%s", in.Digest)
	}
	row("size", "%s", humanBytes(in.Size))
	for i, f := range in.Files {
		k := ""
		if i == 0 {
			k = "files"
		}
		row(k, "%-40s %10s", f.Name, humanBytes(f.Size))
	}
	tw.Flush()
}

func rmCmd(args []string) error {
	fs := flag.NewFlagSet("kiln rm", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln rm MODEL...   (kiln rm Qwen/Qwen3-8B Qwen/Qwen3-8B-GGUF:Q4_K_M)\n\nRemoves models from the Hugging Face cache: the snapshot MODEL names (or, for ORG/NAME:QUANT,\nthat GGUF file) and the blobs nothing else uses. Ollama's models are Ollama's: `ollama rm`.\n")
	}
	names, err := modelArgs(fs, args)
	if err != nil {
		return err
	}
	cat := newCatalog()
	for _, name := range names {
		m, freed, err := cat.Remove(name)
		if err != nil {
			return err
		}
		fmt.Printf("removed %s (%s freed)\n", m.Name, humanBytes(freed))
	}
	return nil
}

// thousands writes n with commas between groups of three digits.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
