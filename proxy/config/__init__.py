"""What a user writes: the experiment file and caps files, validated with one-line errors."""
