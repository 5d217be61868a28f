package chat

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)
