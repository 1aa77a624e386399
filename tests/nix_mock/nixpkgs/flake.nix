{
  description = "Test stand-in for NixOS/nixpkgs (offline mock evaluation only)";

  outputs =
    { self }:
    let
      systems = [
        "aarch64-darwin"
        "aarch64-linux"
        "x86_64-darwin"
        "x86_64-linux"
      ];

      lib = {
        genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);
        escapeShellArg = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] (toString s) + "'";
      };

      mkPkgs =
        system:
        let
          # Derivations run the host's /bin/sh with the host's coreutils
          # (the tests run Nix with sandbox = false).
          runCommand =
            name: env: script:
            derivation (
              {
                inherit name system;
                builder = "/bin/sh";
                args = [
                  "-c"
                  script
                ];
                PATH = "/usr/local/bin:/usr/bin:/bin";
              }
              // env
            );

          writeShellScriptBin =
            name: text:
            runCommand name { inherit text; } ''
              set -e
              mkdir -p "$out/bin"
              { echo '#!/bin/bash'; printf '%s\n' "$text"; } > "$out/bin/${name}"
              chmod +x "$out/bin/${name}"
            ''
            // {
              meta.mainProgram = name;
            };

          linkFarm =
            name: entries:
            runCommand name { } (
              "set -e\nmkdir -p \"$out\"\n"
              + builtins.concatStringsSep "" (
                map (entry: "ln -s ${lib.escapeShellArg entry.path} \"$out\"/${lib.escapeShellArg entry.name}\n") entries
              )
            );
        in
        {
          inherit
            system
            runCommand
            writeShellScriptBin
            linkFarm
            ;
        };
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs systems mkPkgs;
    };
}
