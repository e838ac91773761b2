//go:build tools

// Package s3tools pins the Versity S3 Gateway, whose command the local cluster builds
// unmodified (`go build github.com/versity/versitygw/cmd/versitygw`). This file only keeps it
// in go.mod and go.sum.
package s3tools

import (
	_ "github.com/versity/versitygw/cmd/versitygw"
)
