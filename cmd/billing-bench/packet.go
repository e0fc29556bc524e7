package main

import (
	"context"
	"fmt"
	"time"
)

// setMaxPacket sets the server's GLOBAL max_allowed_packet to bytes for
// the run (-max-allowed-packet): connections opened after it, every
// measurement's, take it as their session value, and the service sizes
// its statements by it (package stmt). restore sets the value found
// before; the bench calls it however the run ends. The setting is
// server-wide: on shared servers, run the bench alone.
func setMaxPacket(ctx context.Context, admin string, bytes int64) (restore func(), err error) {
	db, err := adminDB(admin)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var was int64
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.max_allowed_packet").Scan(&was); err != nil {
		return nil, fmt.Errorf("max_allowed_packet: %w", err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", bytes)); err != nil {
		return nil, fmt.Errorf("set max_allowed_packet: %w", err)
	}
	fmt.Printf("server max_allowed_packet set to %d for the run (was %d)\n", bytes, was)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db, err := adminDB(admin)
		if err == nil {
			defer db.Close()
			_, err = db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", was))
		}
		if err != nil {
			fmt.Printf("WARNING: could not restore max_allowed_packet to %d: %v\n", was, err)
			return
		}
		fmt.Printf("server max_allowed_packet restored to %d\n", was)
	}, nil
}
