"""Widgets of the TUI. Each one gets its data as attributes or method arguments from its screen
and reports user intent by posting messages; none of them reads run folders by itself, except
`LogTail`, whose whole job is to follow the one file it is given."""
