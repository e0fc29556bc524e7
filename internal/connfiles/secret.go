package connfiles

import (
	"fmt"
	"os"
	"strings"
)

// ReadSecret reads a secret from a file, dropping trailing CR and LF
// (editors and `echo` add them). An empty secret is an error.
func ReadSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	return s, nil
}
