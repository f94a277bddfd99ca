from workbench.fork_launch import prepare_process_title

prepare_process_title()  # before anything changes the environment (see its docstring)

from workbench.cli.main import main  # noqa: E402

main()
